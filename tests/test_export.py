"""Specifications of the SavedModel export: the serving contract, fidelity, warm-up, atomic versions."""

import hashlib
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import keras
import numpy as np
import pytest
from support import requires_tensorflow

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


def test_a_mixed_precision_run_is_served_as_its_float32_rebuild(tmp_path):
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    trained = build_model("quadratic_tiny", seed=2, dtype="mixed_float16", **SMALL)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    trained.save(run / "checkpoints" / "best.keras")
    (run / "checkpoints" / "best.json").write_text(json.dumps({"val_accuracy": 0.1, "epoch": 1}))
    (run / "config.json").write_text(json.dumps({"model": "quadratic_tiny", "dataset": "cifar10",
                                                 "model_overrides": SMALL}))
    path = export.export_registered(export_dir=tmp_path / "saved_models", run_dir=run)
    assert types_pb2.DT_HALF not in saved_graph_dtypes(path)
    rebuilt = build_model("quadratic_tiny", seed=3, dtype="float32", **SMALL)
    rebuilt.set_weights(trained.get_weights())
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    pixels = images(4)
    np.testing.assert_allclose(served(images=tf.constant(pixels))["probabilities"].numpy(),
                               keras_probabilities(rebuilt, pixels), rtol=1e-5, atol=1e-7)
    # A model given without its registry config is served as it is: here, in float16.
    as_is = export.export_saved_model(trained, tmp_path / "saved_models", model_name="as_is", warmup=False)
    assert types_pb2.DT_HALF in saved_graph_dtypes(as_is)


def tree_digest(path):
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + file.read_bytes())
    return digest.hexdigest()


def test_existing_version_is_never_overwritten(exported):
    model, root, path = exported
    before = tree_digest(path)
    with pytest.raises(FileExistsError, match="never overwritten.*version=1"):
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


def tiny_model():
    """A model that exports in about a second: enough for the publication and file-system tests."""
    return keras.Sequential([keras.Input((8, 8, 3)), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)],
                            name="tiny")


def exported_version(path):
    return json.loads((path / "assets.extra" / "metadata.json").read_text())["version"]


def _export_tiny_after_barrier(barrier, root, results):
    """Runs in a spawned process: both exports start at once, so both see the same next version."""
    model = tiny_model()
    barrier.wait(timeout=300)
    try:
        results.put(str(export.export_saved_model(model, root, warmup=False)))
    except BaseException as error:
        results.put(repr(error))


def test_concurrent_exports_of_one_model_publish_distinct_complete_versions(tmp_path):
    import tensorflow as tf

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_export_tiny_after_barrier, args=(barrier, str(tmp_path), results))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    paths = sorted(results.get(timeout=300) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
    assert paths == [str(tmp_path / "tiny" / "1"), str(tmp_path / "tiny" / "2")]
    for path in map(Path, paths):
        assert exported_version(path) == int(path.name)
        served = tf.saved_model.load(str(path)).signatures["serving_default"]
        assert served(images=tf.zeros((2, 8, 8, 3), tf.uint8))["probabilities"].shape == (2, 3)
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == ["1", "2"]  # no staging left
    assert 'name: "tiny"' in (tmp_path / "models.config").read_text()


def test_a_stale_next_version_publishes_the_next_free_one(tmp_path, monkeypatch):
    first = export.export_saved_model(tiny_model(), tmp_path, warmup=False)
    before = tree_digest(first)
    # As if another export had published version 1 between our choice of number and our rename.
    monkeypatch.setattr(export, "next_version", lambda model_dir: 1)
    second = export.export_saved_model(tiny_model(), tmp_path, warmup=False)
    assert second == tmp_path / "tiny" / "2" and exported_version(second) == 2
    assert tree_digest(first) == before


def test_the_next_version_is_past_every_existing_one_even_an_empty_one(tmp_path):
    # Version 2 is being copied in by another tool (its directory is still empty): a rename onto an empty
    # directory would replace it, so the export must pick a number past it, not the last existing one.
    (tmp_path / "tiny" / "1").mkdir(parents=True)
    (tmp_path / "tiny" / "1" / "saved_model.pb").write_text("version 1")
    (tmp_path / "tiny" / "2").mkdir()
    path = export.export_saved_model(tiny_model(), tmp_path, warmup=False)
    assert path == tmp_path / "tiny" / "3" and exported_version(path) == 3
    assert (tmp_path / "tiny" / "1" / "saved_model.pb").read_text() == "version 1"
    assert list((tmp_path / "tiny" / "2").iterdir()) == []


def test_an_explicit_version_published_meanwhile_is_not_overwritten(tmp_path, monkeypatch):
    other = tmp_path / "tiny" / "5" / "saved_model.pb"
    real_copy = export.float32_copy

    def publish_version_5_meanwhile(*args):
        other.parent.mkdir(parents=True)
        other.write_text("another export")
        return real_copy(*args)

    monkeypatch.setattr(export, "float32_copy", publish_version_5_meanwhile)
    with pytest.raises(FileExistsError, match="never overwritten.*version=5"):
        export.export_saved_model(tiny_model(), tmp_path, version=5, warmup=False)
    assert other.read_text() == "another export"
    assert [p.name for p in (tmp_path / "tiny").iterdir()] == ["5"]


def test_staging_left_by_dead_exports_is_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    host, day = socket.gethostname(), 24 * 3600
    stagings = {  # name: (age in seconds, removed by the next export)
        f".tmp-0a1b2c3d-{host}-{dead.pid}": (0, True),
        f".tmp-0a1b2c3d-{host}-{os.getpid()}": (2 * day, False),  # live: kept whatever its age
        f".tmp-0a1b2c3d-elsewhere-{dead.pid}": (0, False),  # another host: its pid means nothing here
        f".tmp-0a1b2c3d-elsewhere-{os.getpid()}": (2 * day, True),  # ... but it is a day old
        ".tmp-1-999": (2 * day, True),  # the former naming, a day old
    }
    for name, (age, _) in stagings.items():
        (tmp_path / "tiny" / name).mkdir(parents=True)
        (tmp_path / "tiny" / name / "saved_model.pb").write_text("partial")
        os.utime(tmp_path / "tiny" / name, (time.time() - age,) * 2)
    export.export_saved_model(tiny_model(), tmp_path, warmup=False)
    kept = {p.name for p in (tmp_path / "tiny").iterdir()}
    assert kept == {"1"} | {name for name, (_, removed) in stagings.items() if not removed}


@pytest.fixture
def forbid_work(monkeypatch):
    """Fails the test if the export starts building the serving model."""

    def fail(*args, **kwargs):
        raise AssertionError("the export did work before checking that it could publish")

    monkeypatch.setattr(export, "float32_copy", fail)
    monkeypatch.setattr("keras_attnconv.models.build_model", fail)


def test_a_read_only_export_root_fails_before_any_work(tmp_path, monkeypatch, forbid_work):
    root = tmp_path / "saved_models"
    (root / "tiny").mkdir(parents=True)  # writable: only models.config could not be written
    root.chmod(0o555)
    try:
        try:
            (root / "probe").touch()
        except PermissionError:
            pass
        else:  # root ignores file modes: answer as os.access would for another user
            (root / "probe").unlink()
            real_access = os.access
            monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != root and real_access(path, mode))
        with pytest.raises(PermissionError, match="export_dir") as error:
            export.export_saved_model(tiny_model(), root, warmup=False)
        assert f"{root} is not writable" in str(error.value)
        with pytest.raises(PermissionError, match="export_dir"):
            export.export_registered("quadratic_tiny", root)
        assert [p.name for p in root.iterdir()] == ["tiny"] and list((root / "tiny").iterdir()) == []
    finally:
        root.chmod(0o755)


def test_an_export_root_under_a_file_fails_before_any_work(tmp_path, forbid_work):
    (tmp_path / "file").write_text("not a directory")
    root = tmp_path / "file" / "saved_models"
    with pytest.raises(NotADirectoryError, match="export_dir") as error:
        export.export_saved_model(tiny_model(), root, warmup=False)
    assert f"{tmp_path / 'file'} is a file" in str(error.value)
    with pytest.raises(NotADirectoryError, match="export_dir"):
        export.export_registered("quadratic_tiny", root)
    assert (tmp_path / "file").read_text() == "not a directory"


def test_models_config_lists_a_model_published_while_it_is_written(tmp_path, monkeypatch):
    (tmp_path / "a" / "1").mkdir(parents=True)
    real_write = export.write_atomically

    def another_export_publishes_meanwhile(path, write):
        if not (tmp_path / "b").exists():  # after our scan, before our write lands
            (tmp_path / "b" / "1").mkdir(parents=True)
            export.write_models_config(tmp_path)
        real_write(path, write)

    monkeypatch.setattr(export, "write_atomically", another_export_publishes_meanwhile)
    config = export.write_models_config(tmp_path).read_text()
    assert 'name: "a"' in config and 'name: "b"' in config


@pytest.mark.slow
def test_export_all_paper_configurations(tmp_path):
    from keras_attnconv import cli

    assert cli.main(["export", "--all", "--export-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(export.paper_configurations())
