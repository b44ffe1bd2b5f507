"""Specifications of the SavedModel export: the serving contract, fidelity, warm-up, atomic versions."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from conftest import requires_tensorflow

from keras_attnconv import build_model, export
from keras_attnconv.data import dataset_info, normalize_numpy

pytestmark = requires_tensorflow
SMALL = {"num_layers": 1, "hidden_dim": 16, "intermediate_dim": 16}


def images(count=5, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)


def keras_probabilities(model, pixels):
    logits = keras.ops.convert_to_numpy(model(normalize_numpy(pixels, dataset_info("cifar10"))))
    return keras.ops.convert_to_numpy(keras.ops.softmax(logits.astype("float64"), axis=-1))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved_models")
    model = build_model("quadratic_tiny", seed=1, **SMALL)
    path = export.export_saved_model(model, root, model_name="quadratic_tiny", metadata={"note": "test"})
    return model, root, path


def test_fresh_process_without_keras_attnconv_serves_the_same_predictions(exported, tmp_path):
    model, _, path = exported
    pixels = images()
    np.save(tmp_path / "images.npy", pixels)
    script = textwrap.dedent(f"""
        import sys
        sys.modules["keras_attnconv"] = None  # the package must not be needed
        import numpy as np, tensorflow as tf
        try:
            import keras_attnconv
            raise SystemExit("keras_attnconv was importable")
        except ImportError:
            pass
        served = tf.saved_model.load({str(path)!r}).signatures["serving_default"]
        out = served(images=tf.constant(np.load({str(tmp_path / "images.npy")!r})))
        out = {{k: v.numpy() for k, v in out.items()}}
        out["class_names"] = np.array([name.decode() for name in out["class_names"]])
        np.savez({str(tmp_path / "out.npz")!r}, **out)
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    expected = keras_probabilities(model, pixels)
    np.testing.assert_allclose(out["probabilities"], expected, atol=1e-5)
    np.testing.assert_array_equal(out["classes"], expected.argmax(-1))
    names = np.array(dataset_info("cifar10").class_names)[expected.argmax(-1)]
    assert out["class_names"].tolist() == names.tolist()


def test_signature_contract(exported):
    import tensorflow as tf

    _, _, path = exported
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    (spec,) = served.structured_input_signature[1].values()
    assert list(served.structured_input_signature[1]) == ["images"]
    assert spec.dtype == tf.uint8 and spec.shape.as_list() == [None, 32, 32, 3]
    outputs = served.structured_outputs
    assert {k: v.dtype for k, v in outputs.items()} == {
        "probabilities": tf.float32, "classes": tf.int64, "class_names": tf.string}
    assert outputs["probabilities"].shape.as_list() == [None, 10]
    assert outputs["classes"].shape.as_list() == [None]
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError)):
        served(images=tf.zeros((1, 32, 32, 3), tf.float32))
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError)):
        served(images=tf.zeros((1, 28, 28, 3), tf.uint8))


def test_warmup_requests_parse_and_run(exported):
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    _, _, path = exported
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    records = list(tf.data.TFRecordDataset(str(path / "assets.extra" / export.WARMUP_FILE)).as_numpy_iterator())
    assert len(records) == len(export.WARMUP_BATCH_SIZES)
    for record, batch in zip(records, export.WARMUP_BATCH_SIZES):
        log = prediction_log_pb2.PredictionLog.FromString(record)
        assert log.predict_log.request.model_spec.signature_name == "serving_default"
        pixels = tf.make_ndarray(log.predict_log.request.inputs["images"])
        assert pixels.dtype == np.uint8 and pixels.shape == (batch, 32, 32, 3)
        assert served(images=tf.constant(pixels))["probabilities"].shape == (batch, 10)


def test_metadata_and_models_config(exported):
    _, root, path = exported
    metadata = json.loads((path / "assets.extra" / "metadata.json").read_text())
    assert metadata["model"] == "quadratic_tiny" and metadata["version"] == 1 and metadata["note"] == "test"
    assert metadata["trainable_parameters"] > 0 and metadata["keras_attnconv_version"]
    config = (root / "models.config").read_text()
    assert 'name: "quadratic_tiny"' in config and 'base_path: "/models/quadratic_tiny"' in config


def saved_graph_dtypes(path):
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0].graph_def
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return {attr.type for node in nodes for attr in node.attr.values() if attr.type} | {
        t for node in nodes for attr in node.attr.values() for t in attr.list.type}


def test_mixed_float16_model_exports_a_float32_graph(tmp_path):
    from tensorflow.core.framework import types_pb2

    keras.mixed_precision.set_dtype_policy("mixed_float16")
    model = build_model("quadratic_tiny", seed=2, **SMALL)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(normalize_numpy(images(8), dataset_info("cifar10")), np.arange(8) % 10, epochs=1, verbose=0)
    keras.mixed_precision.set_dtype_policy("float32")
    path = export.export_saved_model(model, tmp_path, model_name="mixed", warmup=False)
    assert types_pb2.DT_HALF not in saved_graph_dtypes(path)
    # Control: without the float32 rebuild the same export does contain float16 ops.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export, "float32_copy", lambda m: m)
        unconverted = export.export_saved_model(model, tmp_path, model_name="unconverted", warmup=False)
    assert types_pb2.DT_HALF in saved_graph_dtypes(unconverted)
    import tensorflow as tf

    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    pixels = images(4)
    np.testing.assert_allclose(served(images=tf.constant(pixels))["probabilities"].numpy(),
                               keras_probabilities(model, pixels), atol=1e-2)


def tree_digest(path):
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + file.read_bytes())
    return digest.hexdigest()


def test_existing_version_is_never_overwritten(exported):
    model, root, path = exported
    before = tree_digest(path)
    with pytest.raises(FileExistsError, match="never overwritten"):
        export.export_saved_model(model, root, version=1, model_name="quadratic_tiny")
    assert tree_digest(path) == before


def test_an_interrupted_export_leaves_no_version(tmp_path, monkeypatch):
    model = build_model("quadratic_tiny", seed=3, **SMALL)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed midway")

    monkeypatch.setattr(export, "_write_warmup", crash)
    with pytest.raises(KeyboardInterrupt):
        export.export_saved_model(model, tmp_path, model_name="m")
    assert list((tmp_path / "m").iterdir()) == []
    # A staging directory left by a SIGKILL is hidden and never counts as a version.
    (tmp_path / "m" / ".tmp-1-999").mkdir()
    assert export.next_version(tmp_path / "m") == 1


def test_xla_export_matches(tmp_path, exported):
    import tensorflow as tf

    model, _, _ = exported
    path = export.export_saved_model(model, tmp_path, model_name="xla", jit_compile=True, warmup=False)
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    pixels = images(3)
    np.testing.assert_allclose(served(images=tf.constant(pixels))["probabilities"].numpy(),
                               keras_probabilities(model, pixels), atol=1e-5)


def test_export_all_writes_every_model_and_the_config(tmp_path, monkeypatch):
    from keras_attnconv import cli

    monkeypatch.setattr(export, "paper_configurations", lambda: ["quadratic_tiny", "resnet_tiny"])
    assert cli.main(["export", "--all", "--export-dir", str(tmp_path)]) == 0
    for name in ("quadratic_tiny", "resnet_tiny"):
        metadata = json.loads((tmp_path / name / "1" / "assets.extra" / "metadata.json").read_text())
        assert metadata["weights"].startswith("initial")
        assert metadata["model_config"]["num_classes"] == 10
    assert (tmp_path / "models.config").read_text().count("config {") == 2


@pytest.mark.slow
def test_export_all_paper_configurations(tmp_path):
    from keras_attnconv import cli

    assert cli.main(["export", "--all", "--export-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(export.paper_configurations())
