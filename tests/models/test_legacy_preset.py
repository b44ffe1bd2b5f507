"""A preset written by an earlier version (tests/data/legacy, commit 5e2a6a1) loads as the same model."""

from pathlib import Path

import numpy as np

from keras_attnconv import AttentionClassifier, from_preset
from keras_attnconv.models.presets import load_preset_metadata

LEGACY = Path(__file__).parents[1] / "data" / "legacy"


def test_earlier_preset_loads_as_its_class_with_its_weights():
    expected = np.load(LEGACY / "expected.npz")

    model = from_preset(str(LEGACY / "preset"))

    assert isinstance(model, AttentionClassifier) and model.name == "quadratic_tiny"
    assert load_preset_metadata(str(LEGACY / "preset"))["keras_attnconv_version"] == str(expected["version"])
    np.testing.assert_allclose(np.asarray(model.predict(expected["images"], verbose=0)), expected["logits"], atol=1e-5)
