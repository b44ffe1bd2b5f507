"""Specifications of the SavedModel export: the serving contract, fidelity, warm-up, atomic versions, the model's
own name (or a safe serving name) and nothing written outside the export root, the served version of models.config.

The other formats, and every model family in the real runtimes: test_export_formats.py."""

import dataclasses
import errno
import json
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import keras
import numpy as np
import pytest
from support import requires_tensorflow, served_config, tiny_model, tree_digest

from keras_attnconv import build_model, export, save_to_preset
from keras_attnconv.export import exporter, formats
from keras_attnconv.export.root import VERSION_FILES, ExportRoot
from keras_attnconv.training.data import dataset_info, load_arrays
from keras_attnconv.utils.ownership import write_mark

pytestmark = requires_tensorflow
SMALL = {"num_layers": 1, "hidden_dim": 16, "intermediate_dim": 16}


def images(count=5, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)


def keras_probabilities(model, pixels):
    logits = keras.ops.convert_to_numpy(model(pixels))
    return keras.ops.convert_to_numpy(keras.ops.softmax(logits.astype("float64"), axis=-1))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved_models")
    model = build_model("quadratic_tiny", seed=1, **SMALL)
    path = export.export_model(model, root, metadata={"note": "test"})
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
        "probabilities": tf.float32,
        "classes": tf.int64,
        "class_names": tf.string,
    }
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
    records = list(tf.data.TFRecordDataset(str(path / "assets.extra" / formats.WARMUP_FILE)).as_numpy_iterator())
    assert len(records) == len(formats.WARMUP_BATCH_SIZES)
    for record, batch in zip(records, formats.WARMUP_BATCH_SIZES):
        log = prediction_log_pb2.PredictionLog.FromString(record)
        assert log.predict_log.request.model_spec.signature_name == "serving_default"
        pixels = tf.make_ndarray(log.predict_log.request.inputs["images"])
        assert pixels.dtype == np.uint8 and pixels.shape == (batch, 32, 32, 3)
        assert served(images=tf.constant(pixels))["probabilities"].shape == (batch, 10)


def metadata_of(path):
    return json.loads((path / "assets.extra" / "metadata.json").read_text())


def test_metadata_says_what_was_exported(exported):
    model, _, path = exported
    metadata = metadata_of(path)
    assert (metadata["model"], metadata["serving_name"], metadata["version"], metadata["format"]) == (
        "quadratic_tiny",
        "quadratic_tiny",
        1,
        "saved_model",
    )
    assert metadata["note"] == "test" and metadata["class"] == "keras_attnconv>AttentionClassifier"
    assert metadata["config"] == json.loads(json.dumps(model.get_config()))
    assert metadata["preprocessing"]["class_names"] == list(dataset_info("cifar10").class_names)
    assert metadata["parameter_count"] == model.count_params() and metadata["keras_attnconv_version"]


def test_models_config_is_tf_servings_config_serving_one_version_per_model(exported):
    _, root, _ = exported
    assert served_config(root) == {"quadratic_tiny": ("/models/quadratic_tiny", "tensorflow", [1])}


def saved_graph_dtypes(path):
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0].graph_def
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return {attr.type for node in nodes for attr in node.attr.values() if attr.type} | {
        t for node in nodes for attr in node.attr.values() for t in attr.list.type
    }


def test_a_mixed_precision_model_is_exported_as_its_float32_copy(tmp_path):
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    trained = build_model("quadratic_tiny", seed=2, dtype="mixed_float16", **SMALL)
    path = export.export_model(trained, tmp_path / "saved_models", warmup=False)
    assert types_pb2.DT_HALF not in saved_graph_dtypes(path)
    assert metadata_of(path)["dtype_policy"] == "float32"
    rebuilt = build_model("quadratic_tiny", seed=3, dtype="float32", **SMALL)
    rebuilt.set_weights(trained.get_weights())
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    pixels = images(4)
    np.testing.assert_allclose(
        served(images=tf.constant(pixels))["probabilities"].numpy(),
        keras_probabilities(rebuilt, pixels),
        rtol=1e-5,
        atol=1e-7,
    )


def test_a_bfloat16_export_computes_in_bfloat16_behind_the_float32_signature(tmp_path, exported):
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    model, _, float32_path = exported
    path = export.export_model(model, tmp_path, compute_dtype="bfloat16", warmup=False)
    assert types_pb2.DT_BFLOAT16 in saved_graph_dtypes(path)
    assert types_pb2.DT_BFLOAT16 not in saved_graph_dtypes(float32_path)
    info = metadata_of(path)
    assert (info["compute_dtype"], info["dtype_policy"]) == ("bfloat16", "mixed_bfloat16")
    assert metadata_of(float32_path)["compute_dtype"] == "float32"
    assert info["signature"] == metadata_of(float32_path)["signature"]  # uint8 images in, float32 out
    assert model.dtype_policy.name == "float32"  # the model given is left as it was
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    pixels = load_arrays("cifar10_sample", "validation")[0][:16]  # real images: the probabilities are not flat
    probabilities = served(images=tf.constant(pixels))["probabilities"]
    assert probabilities.dtype == tf.float32
    # bfloat16 keeps 8 bits of mantissa: near float32's probabilities, not equal to them.
    difference = np.abs(probabilities.numpy() - keras_probabilities(model, pixels)).max()
    assert 0 < difference < 2e-2


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"compute_dtype": "float16"},
            "`compute_dtype` must be one of 'float32', 'bfloat16'.* Received: compute_dtype='float16'",
        ),
        (
            {"compute_dtype": "bfloat16", "format": "onnx"},
            "other than float32 apply to SavedModels only.* format='onnx'.* compute_dtype='bfloat16'",
        ),
    ],
)
def test_a_compute_dtype_is_checked_before_any_work(tmp_path, forbid_work, options, message):
    with pytest.raises(ValueError, match=message):
        export.export_model(tiny_model(), tmp_path / "exports", warmup=False, **options)
    assert not (tmp_path / "exports").exists()


def test_existing_version_is_never_overwritten(exported):
    model, root, path = exported
    before = tree_digest(path)
    with pytest.raises(FileExistsError, match="never overwritten.*version=1"):
        export.export_model(model, root, version=1)
    assert tree_digest(path) == before


@pytest.mark.parametrize("format", ["saved_model", "onnx", "litert"])  # TensorFlow's writers fail, or Python's
def test_a_disk_that_fills_during_the_export_is_one_error_naming_the_root_and_nothing_is_published(small_disk, format):
    if format != "saved_model":  # the export extra's converter
        pytest.importorskip({"onnx": "tf2onnx", "litert": "ai_edge_litert"}[format])
    root = small_disk / "root"
    filler = small_disk / "filler"  # another process took all but two pages: the mark fits, the export does not
    filler.write_bytes(bytes(shutil.disk_usage(small_disk).free - 2 * 4096))
    with pytest.raises(OSError, match=f"nothing was published.*Received: export_dir='{root}'$") as raised:
        export.export_model(tiny_model(), root, format=format, warmup=False)
    assert raised.value.errno == errno.ENOSPC
    assert list((root / "tiny").iterdir()) == []  # no version, no staging left
    filler.unlink()
    assert export.export_model(tiny_model(), root, format=format, warmup=False) == root / "tiny" / "1"


def test_an_interrupted_export_leaves_no_version(tmp_path, monkeypatch):
    model = tiny_model()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed midway")

    monkeypatch.setattr(formats, "_write_warmup", crash)
    with pytest.raises(KeyboardInterrupt):
        export.export_model(model, tmp_path)
    assert list((tmp_path / "tiny").iterdir()) == []
    # A staging directory left by a SIGKILL is hidden and never counts as a version.
    (tmp_path / "tiny" / ".tmp-1-999").mkdir()
    assert ExportRoot(tmp_path).next_version("tiny") == 1


def test_xla_export_matches(tmp_path, exported):
    import tensorflow as tf

    model, _, _ = exported
    path = export.export_model(model, tmp_path, serving_name="xla", jit_compile=True, warmup=False)
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    pixels = images(3)
    np.testing.assert_allclose(
        served(images=tf.constant(pixels))["probabilities"].numpy(), keras_probabilities(model, pixels), atol=1e-5
    )


def test_export_all_writes_each_registered_configuration_under_its_own_name(tmp_path, monkeypatch):
    from keras_attnconv import cli
    from keras_attnconv.models import get_model_config

    monkeypatch.setattr(exporter, "paper_configurations", lambda: ["quadratic_tiny", "resnet_tiny"])
    assert cli.main(["export", "--all", "--export-dir", str(tmp_path)]) == 0
    for name in ("quadratic_tiny", "resnet_tiny"):
        metadata = metadata_of(tmp_path / name / "1")
        assert metadata["weights"].startswith("initial") and metadata["model"] == metadata["serving_name"] == name
        config = {k: v for k, v in metadata["config"].items() if k not in ("name", "trainable", "dtype")}
        assert config == json.loads(json.dumps(dataclasses.asdict(get_model_config(name))))
    assert sorted(served_config(tmp_path)) == ["quadratic_tiny", "resnet_tiny"]


def trained_run(path, model):
    """A finished training run as `train` leaves it: its best model as preset/ with the metrics of its weights."""
    save_to_preset(
        model,
        path / "preset",
        metadata={
            "weights": "trained: the best epoch",
            "dataset": "cifar10",
            "metrics": {"eval_accuracy": 0.284, "epoch": 5},
        },
    )
    return path


def test_a_run_is_exported_only_under_its_own_model_name(tmp_path, capsys):
    from keras_attnconv import cli

    run = trained_run(tmp_path / "run", build_model("quadratic_tiny", seed=4, **SMALL))
    root = tmp_path / "saved_models"
    for args in (["--all"], ["--model", "quadratic"]):  # one checkpoint under the names of other models: never
        assert cli.main(["export", str(run), *args, "--export-dir", str(root)]) == 2
        assert "give one of SOURCE" in capsys.readouterr().err
    assert not root.exists()
    assert cli.main(["export", str(run), "--export-dir", str(root)]) == 0
    path = root / "quadratic_tiny" / "1"
    assert capsys.readouterr().out.split() == [str(path)]
    metadata = metadata_of(path)
    # Where the preset is seen from the export root: no absolute path of the machine that exported it.
    assert metadata["model"] == "quadratic_tiny" and metadata["source"] == os.path.join("..", "run", "preset")
    assert metadata["metrics"] == {"eval_accuracy": 0.284, "epoch": 5}  # the exported weights' own metrics


def test_a_serving_name_is_a_plain_name_recorded_beside_the_models_own(tmp_path):
    path = export.export_model(tiny_model(), tmp_path / "root", serving_name="classifier-v2.1", warmup=False)
    assert path == tmp_path / "root" / "classifier-v2.1" / "1"
    assert (metadata_of(path)["model"], metadata_of(path)["serving_name"]) == ("tiny", "classifier-v2.1")
    assert sorted(served_config(tmp_path / "root")) == ["classifier-v2.1"]


UNSAFE_NAMES = ["../../x", "../x", "/tmp/elsewhere", "a/b", ".", "..", ".hidden", 'a"b }', "", "a b", "naïve", "-x"]


@pytest.mark.parametrize("name", [*UNSAFE_NAMES, 7, None])
def test_a_serving_name_that_is_not_a_plain_name_writes_nothing_anywhere(tmp_path, name, capsys):
    from keras_attnconv import cli

    root = tmp_path / "a" / "b" / "root"
    root.mkdir(parents=True)
    if name is not None:
        with pytest.raises(ValueError, match=re.escape(f"Received: serving_name={name!r}")):
            export.export_model(tiny_model(), root, serving_name=name, warmup=False)
    if isinstance(name, str):
        assert cli.main(["export", "--model", "resnet_tiny", f"--name={name}", "--export-dir", str(root)]) == 2
        assert f"Received: name={name!r}" in capsys.readouterr().err  # the command's --name
    assert [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")] == ["a", "a/b", "a/b/root"]


@pytest.mark.parametrize("name", [n for n in UNSAFE_NAMES if n and "/" not in n])  # Keras refuses '/' itself
def test_a_model_whose_own_name_is_not_a_plain_name_needs_a_serving_name(tmp_path, name):
    with pytest.raises(ValueError, match=re.escape(f"Received: name={name!r}")):
        export.export_model(tiny_model(name=name), tmp_path, warmup=False)
    assert list(tmp_path.iterdir()) == []
    if name.startswith("."):  # TensorFlow itself refuses to trace a model named like the others
        path = export.export_model(tiny_model(name=name), tmp_path, serving_name="safe", warmup=False)
        assert path == tmp_path / "safe" / "1" and metadata_of(path)["model"] == name


def test_only_models_of_the_zoo_are_exported(tmp_path):
    plain = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="keras_attnconv model.*Received: model of class Sequential"):
        export.export_model(plain, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_publishing_a_version_does_not_change_the_served_one(tmp_path, capsys):
    from keras_attnconv import cli

    root = tmp_path / "root"
    first = export.export_model(tiny_model(), root, warmup=False)
    second = export.export_model(tiny_model(seed=1), root, warmup=False)
    assert (first.name, second.name) == ("1", "2")
    assert served_config(root)["tiny"][2] == [1]  # still the first
    assert export.export_model(tiny_model(seed=2), root, serve=True, warmup=False).name == "3"
    assert served_config(root)["tiny"][2] == [3]
    assert cli.main(["serve", "tiny", "2", "--export-dir", str(root)]) == 0  # back to 2
    assert served_config(root)["tiny"][2] == [2]
    assert cli.main(["serve", "tiny", "9", "--export-dir", str(root)]) == 2
    assert "tiny/9 holds no SavedModel to serve. Received: name='tiny', version=9" in capsys.readouterr().err
    assert served_config(root)["tiny"][2] == [2]
    # Another model's export keeps this one's choice.
    export.export_model(tiny_model(name="other"), root, warmup=False)
    assert {name: versions for name, (_, _, versions) in served_config(root).items()} == {"other": [1], "tiny": [2]}


def test_a_served_version_that_was_removed_falls_back_to_the_newest(tmp_path):
    root = tmp_path / "root"
    for seed in range(3):
        export.export_model(tiny_model(seed=seed), root, warmup=False)
    export.set_served_version(root, "tiny", 2)
    shutil.rmtree(root / "tiny" / "2")
    ExportRoot(root).update_models_config()
    assert served_config(root)["tiny"][2] == [3]


def test_a_model_directory_holds_one_format(tmp_path):
    pytest.importorskip("tf2onnx")
    export.export_model(tiny_model(), tmp_path, warmup=False)
    with pytest.raises(ValueError, match="holds saved_model versions: export onnx to another export_dir"):
        export.export_model(tiny_model(), tmp_path, format="onnx")
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == ["1"]


def exported_version(path):
    return json.loads((path / "assets.extra" / "metadata.json").read_text())["version"]


def _export_tiny_after_barrier(barrier, root, results, name="tiny"):
    """Runs in a spawned process: both exports start at once, so both see the same next version."""
    model = tiny_model(name)
    barrier.wait(timeout=300)
    try:
        results.put(str(export.export_model(model, root, warmup=False)))
    except BaseException as error:
        results.put(repr(error))


def export_at_once(root, names):
    """Exports a tiny model named after each of `names`, each in a process of its own, all starting together."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(len(names)), context.Queue()
    workers = [
        context.Process(target=_export_tiny_after_barrier, args=(barrier, str(root), results, name)) for name in names
    ]
    for worker in workers:
        worker.start()
    paths = sorted(results.get(timeout=300) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
    return paths


def test_concurrent_exports_of_one_model_publish_distinct_complete_versions(tmp_path):
    import tensorflow as tf

    paths = export_at_once(tmp_path, ("tiny", "tiny"))
    assert paths == [str(tmp_path / "tiny" / "1"), str(tmp_path / "tiny" / "2")]
    for path in map(Path, paths):
        assert exported_version(path) == int(path.name)
        served = tf.saved_model.load(str(path)).signatures["serving_default"]
        assert served(images=tf.zeros((2, 8, 8, 3), tf.uint8))["probabilities"].shape == (2, 3)
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == ["1", "2"]  # no staging left
    assert served_config(tmp_path)["tiny"][2] == [1]


def test_a_stale_next_version_publishes_the_next_free_one(tmp_path, monkeypatch):
    first = export.export_model(tiny_model(), tmp_path, warmup=False)
    before = tree_digest(first)
    # As if another export had published version 1 between our choice of number and our rename.
    monkeypatch.setattr(ExportRoot, "next_version", lambda self, name: 1)
    second = export.export_model(tiny_model(), tmp_path, warmup=False)
    assert second == tmp_path / "tiny" / "2" and exported_version(second) == 2
    assert tree_digest(first) == before


def test_the_next_version_is_past_every_existing_one_even_an_empty_one(tmp_path):
    # Version 2 is being copied in by another tool (its directory is still empty): a rename onto an empty
    # directory would replace it, so the export must pick a number past it, not the last existing one.
    (tmp_path / "tiny" / "1").mkdir(parents=True)
    (tmp_path / "tiny" / "1" / "saved_model.pb").write_text("version 1")
    (tmp_path / "tiny" / "2").mkdir()
    path = export.export_model(tiny_model(), tmp_path, warmup=False)
    assert path == tmp_path / "tiny" / "3" and exported_version(path) == 3
    assert (tmp_path / "tiny" / "1" / "saved_model.pb").read_text() == "version 1"
    assert list((tmp_path / "tiny" / "2").iterdir()) == []


def test_an_explicit_version_published_meanwhile_is_not_overwritten(tmp_path, monkeypatch):
    other = tmp_path / "tiny" / "5" / "saved_model.pb"
    real_copy = exporter.serving_copy

    def publish_version_5_meanwhile(*args):
        other.parent.mkdir(parents=True)
        other.write_text("another export")
        return real_copy(*args)

    monkeypatch.setattr(exporter, "serving_copy", publish_version_5_meanwhile)
    with pytest.raises(FileExistsError, match="never overwritten.*version=5"):
        export.export_model(tiny_model(), tmp_path, version=5, warmup=False)
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
        ".tmp-1-999": (2 * day, False),  # no random part: not a name only the package makes, however old
        ".tmp-my-notes": (2 * day, False),  # the user's
    }
    # The package's root (its mark): a folder holding hidden directories only is no TF Serving root of the user's.
    write_mark(tmp_path, "export_root")
    for name, (age, _) in stagings.items():
        (tmp_path / "tiny" / name).mkdir(parents=True)
        (tmp_path / "tiny" / name / "saved_model.pb").write_text("partial")
        os.utime(tmp_path / "tiny" / name, (time.time() - age,) * 2)
    export.export_model(tiny_model(), tmp_path, warmup=False)
    kept = {p.name for p in (tmp_path / "tiny").iterdir()}
    assert kept == {"1"} | {name for name, (_, removed) in stagings.items() if not removed}


@pytest.fixture
def forbid_work(monkeypatch):
    """Fails the test if the export starts building the serving model."""

    def fail(*args, **kwargs):
        raise AssertionError("the export did work before checking that it could publish")

    monkeypatch.setattr(exporter, "serving_copy", fail)
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
            export.export_model(tiny_model(), root, warmup=False)
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
        export.export_model(tiny_model(), root, warmup=False)
    assert f"{tmp_path / 'file'} is a file" in str(error.value)
    with pytest.raises(NotADirectoryError, match="export_dir"):
        export.export_registered("quadratic_tiny", root)
    assert (tmp_path / "file").read_text() == "not a directory"


def test_concurrent_exports_of_two_models_are_both_in_models_config(tmp_path):
    # models.config is read, changed and rewritten under a lock: neither export's entry is lost.
    assert export_at_once(tmp_path, ("a", "b")) == [str(tmp_path / "a" / "1"), str(tmp_path / "b" / "1")]
    assert {name: versions for name, (_, _, versions) in served_config(tmp_path).items()} == {"a": [1], "b": [1]}


def test_a_models_config_that_is_not_tf_servings_is_named_and_left_as_it_is(tmp_path):
    (tmp_path / "models.config").write_text("model_config_list { config { nme: 'x' } }")
    with pytest.raises(ValueError, match="models.config is not a TF Serving model config"):
        export.export_model(tiny_model(), tmp_path, warmup=False)
    assert (tmp_path / "models.config").read_text() == "model_config_list { config { nme: 'x' } }"
    assert [p.name for p in tmp_path.iterdir()] == ["models.config"]  # found before the export, not after


@pytest.mark.slow
def test_export_all_paper_configurations(tmp_path):
    from keras_attnconv import cli

    assert cli.main(["export", "--all", "--export-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(export.paper_configurations())


@pytest.mark.parametrize("format", ["litert", "onnx", "saved_model"])
def test_an_export_its_runtime_cannot_run_is_refused_and_nothing_is_published(tmp_path, format, monkeypatch):
    def refuse(path):  # the runtime's loader, refusing the file
        raise ValueError("Tensor 52 is invalidly specified in schema.")

    module, _ = export.RUNTIMES[format]
    pytest.importorskip(module)
    monkeypatch.setitem(export.RUNTIMES, format, (module, refuse))
    with pytest.raises(
        RuntimeError,
        match=f"The {format} export of tiny cannot be run by {module} .Tensor 52 is "
        f"invalidly specified in schema..; nothing was published",
    ):
        export.export_model(tiny_model(), tmp_path, format=format, warmup=False)
    assert [p.name for p in (tmp_path / "tiny").iterdir()] == []


def test_a_litert_file_its_interpreter_cannot_load_is_never_published(tmp_path, monkeypatch):
    pytest.importorskip("ai_edge_litert")
    convert = formats.write_single_file

    def convert_to_a_damaged_file(model, staging, format, description):
        # The real file, cut in half: a file the real interpreter refuses, as it refused the converter's
        # file for position-only heads on a 2x2 grid before they were one batched matmul.
        signature = convert(model, staging, format, description)
        path = staging / VERSION_FILES[format]
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return signature

    monkeypatch.setattr(exporter, "write_single_file", convert_to_a_damaged_file)
    with pytest.raises(RuntimeError, match="The litert export of quadratic_tiny cannot be run by ai_edge_litert"):
        export.export_model(build_model("quadratic_tiny", seed=0, **SMALL), tmp_path, format="litert")
    assert [p.name for p in (tmp_path / "quadratic_tiny").iterdir()] == []
    monkeypatch.undo()
    path = export.export_model(build_model("quadratic_tiny", seed=0, image_size=8, **SMALL), tmp_path, format="litert")
    assert path == tmp_path / "quadratic_tiny" / "1"


def test_position_only_heads_on_a_2x2_grid_export_to_a_litert_file_that_runs(tmp_path):
    pytest.importorskip("ai_edge_litert")
    model = build_model("quadratic_tiny", seed=0, image_size=4, **SMALL)
    path = export.export_model(model, tmp_path, format="litert")  # it runs the file before publishing it
    assert path == tmp_path / "quadratic_tiny" / "1"


@pytest.mark.parametrize(
    "export_dir, message",
    [
        ("a\0b", "`export_dir` cannot hold a NUL byte"),
        ("x" * 300, "`export_dir` has a name of 300 characters"),
    ],
)
def test_an_export_root_the_system_cannot_name_is_refused_before_any_work(tmp_path, export_dir, message, forbid_work):
    with pytest.raises(ValueError, match=message):
        export.export_model(tiny_model(), tmp_path / export_dir, warmup=False)
    with pytest.raises(ValueError, match=message):
        export.set_served_version(tmp_path / export_dir, "tiny", 1)
    assert list(tmp_path.iterdir()) == []
