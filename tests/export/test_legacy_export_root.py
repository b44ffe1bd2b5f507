"""An export root written by an earlier version (tests/data/legacy, commit 5e2a6a1) is served and extended as it was."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from support import requires_tensorflow, served_config

from keras_attnconv import from_preset
from keras_attnconv.export import export_model

LEGACY = Path(__file__).parents[1] / "data" / "legacy"

pytestmark = requires_tensorflow


@pytest.fixture(scope="module")
def expected():
    return np.load(LEGACY / "expected.npz")


def test_earlier_saved_model_loads_and_gives_its_probabilities(expected):
    import tensorflow as tf

    served = tf.saved_model.load(str(LEGACY / "export_root" / "quadratic_tiny" / "1"))
    outputs = served.signatures["serving_default"](images=tf.constant(expected["images"]))
    logits = expected["logits"]
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    np.testing.assert_allclose(outputs["probabilities"].numpy(), probabilities, atol=1e-6)
    np.testing.assert_array_equal(outputs["classes"].numpy(), logits.argmax(-1))


def test_earlier_export_root_takes_a_new_version_and_keeps_the_old(tmp_path, expected):
    root = tmp_path / "export_root"
    shutil.copytree(LEGACY / "export_root", root)
    model = from_preset(str(LEGACY / "preset"))

    version_dir = export_model(model, str(root), serve=True)

    assert Path(version_dir) == root / "quadratic_tiny" / "2"
    assert (root / "quadratic_tiny" / "1" / "saved_model.pb").read_bytes() == (
        LEGACY / "export_root" / "quadratic_tiny" / "1" / "saved_model.pb"
    ).read_bytes()
    assert served_config(root)["quadratic_tiny"] == ("/models/quadratic_tiny", "tensorflow", [2])
