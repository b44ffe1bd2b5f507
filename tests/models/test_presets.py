"""Presets: a model with its weights and what it is, keras-hub's layout, written whole or not at all."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import keras
import numpy as np
import pytest
from support import assert_same_weights_but_the_head, run_until_killed, snapshot

from keras_attnconv import build_model, from_preset, save_to_preset
from keras_attnconv.models.presets import load_preset_metadata, model_metadata
from keras_attnconv.training.run_directory import RunDirectory
from keras_attnconv.utils.ownership import MARKER, ForeignDirectoryError

SMALL = {"num_layers": 1, "hidden_dim": 8, "intermediate_dim": 8, "image_size": 8}
CLASSES = ("cat", "dog", "owl")


def small_model(dtype=None, **overrides):
    return build_model(
        "quadratic_tiny",
        seed=0,
        dtype=dtype,
        num_classes=3,
        class_names=CLASSES,
        pixel_mean=(0.5, 0.4, 0.3),
        pixel_std=(0.2, 0.3, 0.25),
        **{**SMALL, **overrides},
    )


def images(count=4, size=8):
    return np.random.default_rng(0).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


def outputs(model, x):
    return keras.ops.convert_to_numpy(model(x))


@pytest.mark.parametrize(
    "field, value",
    [
        ("model", "resnet18"),
        ("class", "keras_attnconv>ResNet"),
        ("parameter_count", 7),
        ("preprocessing", {"input": None}),
    ],
)
def test_metadata_that_contradicts_the_model_is_refused_on_save_and_nothing_written(tmp_path, field, value):
    model = small_model()
    said = repr(value)
    with pytest.raises(ValueError) as raised:
        save_to_preset(model, tmp_path / "p", metadata={field: value, "recipe": {"epochs": 3}})
    message = str(raised.value)
    assert len(message.splitlines()) == 1 and message.endswith(f"Received: metadata[{field!r}]={said}")
    assert f"{field}={said}" in message and f"{field}={model_metadata(model)[field]!r}" in message
    assert list(tmp_path.iterdir()) == []


def test_metadata_that_repeats_what_the_model_says_is_saved(tmp_path):
    model = small_model()
    repeated = {field: model_metadata(model)[field] for field in ("model", "class", "parameter_count")}
    path = save_to_preset(model, tmp_path / "p", metadata={**repeated, "preprocessing": model.preprocessing})
    assert from_preset(path).name == "quadratic_tiny"


def test_a_users_hidden_file_beside_a_preset_is_never_taken_for_a_killed_saves_staging(tmp_path):
    # Only names the package makes for its staging (a random part, the host, a pid) are cleaned up; the
    # user's file under a look-alike name stays, however old.
    home = tmp_path / "home"
    home.mkdir()
    notes = home / ".p.tmp-old-notes"
    notes.write_text("mine")
    os.utime(notes, (time.time() - 3 * 24 * 3600,) * 2)
    save_to_preset(small_model(), home / "p")
    assert notes.read_text() == "mine"
    assert sorted(p.name for p in home.iterdir()) == [".p.tmp-old-notes", "p"]


def test_a_preset_reloads_as_the_same_class_config_and_weights(tmp_path):
    model = small_model()
    path = save_to_preset(model, tmp_path / "preset", metadata={"metrics": {"eval_accuracy": 0.5}})
    assert sorted(p.name for p in path.iterdir()) == [MARKER, "config.json", "metadata.json", "model.weights.h5"]
    config = json.loads((path / "config.json").read_text())
    assert config["registered_name"] == "keras_attnconv>AttentionClassifier"
    assert config["config"]["class_names"] == list(CLASSES) and config["config"]["pixel_std"] == [0.2, 0.3, 0.25]
    restored = from_preset(path)
    assert type(restored) is type(model) and restored.name == "quadratic_tiny"
    assert restored.config == model.config and restored.class_names == CLASSES
    np.testing.assert_array_equal(outputs(restored, images()), outputs(model, images()))


def test_the_model_classes_save_and_load_presets_as_keras_hub_models_do(tmp_path):
    from keras_attnconv import AttentionClassifier, ImageClassifier, ResNet

    model = small_model()
    path = model.save_to_preset(tmp_path / "preset", metadata={"metrics": {"eval_accuracy": 0.5}})
    assert path == tmp_path / "preset" and load_preset_metadata(path)["metrics"] == {"eval_accuracy": 0.5}
    for model_class in (AttentionClassifier, ImageClassifier):  # its class, or the base class of every family
        restored = model_class.from_preset(path, num_classes=5)
        assert type(restored) is AttentionClassifier and restored.config.num_classes == 5
        assert_same_weights_but_the_head(restored, model)
    with pytest.raises(
        ValueError,
        match=rf"holds a model of class AttentionClassifier, not ResNet: load it with AttentionClassifier.from_preset,"
        rf".* Received: preset='{path}'$",
    ):
        ResNet.from_preset(path)


def test_a_model_class_refuses_a_registered_name_of_another_family_before_building_or_warning(monkeypatch):
    import warnings

    from keras_attnconv import AttentionClassifier, ResNet

    monkeypatch.setattr(ResNet, "__init__", None)  # building one would fail otherwise
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning of initial weights is not given first
        with pytest.raises(ValueError, match="'resnet_tiny' holds a model of class ResNet, not AttentionClassifier"):
            AttentionClassifier.from_preset("resnet_tiny")
    with pytest.warns(UserWarning, match="initial weights") as caught:
        assert type(AttentionClassifier.from_preset("quadratic_tiny", image_size=8)) is AttentionClassifier
    assert caught[0].filename == __file__  # the warning points at the caller's line, not at the package


@pytest.mark.parametrize("load", [from_preset, build_model], ids=["from_preset", "build_model"])
def test_a_preset_with_other_classes_is_its_features_under_a_new_head(tmp_path, load):
    model = small_model(dtype="mixed_bfloat16")
    path = save_to_preset(model, tmp_path / "preset")
    names = ["ant", "bee", "elk", "fox", "gnu"]
    tuned = load(path, num_classes=5, class_names=names)
    assert type(tuned) is type(model) and tuned.name == model.name and tuned.dtype_policy.name == "mixed_bfloat16"
    assert tuned.class_names == tuple(names) and tuned.config.pixel_std == model.config.pixel_std
    assert tuned.get_layer("logits").kernel.shape == (SMALL["hidden_dim"], 5)
    assert_same_weights_but_the_head(tuned, model)  # the preset's
    assert outputs(tuned, images()).shape == (len(images()), 5)


def test_the_metadata_says_what_the_model_is_and_what_the_saver_adds(tmp_path):
    model = small_model()
    metadata = load_preset_metadata(save_to_preset(model, tmp_path / "p", metadata={"recipe": {"epochs": 3}}))
    assert metadata["model"] == "quadratic_tiny" and metadata["class"] == "keras_attnconv>AttentionClassifier"
    assert metadata["parameter_count"] == model.count_params() and metadata["recipe"] == {"epochs": 3}
    assert metadata["preprocessing"] == {
        "input": {"name": "images", "dtype": "uint8", "shape": [None, 8, 8, 3]},
        "normalization": {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.3, 0.25]},
        "class_names": list(CLASSES),
    }
    assert metadata["keras_version"] == keras.__version__ and metadata["keras_attnconv_version"]


def test_a_mixed_precision_preset_reloads_in_its_policy_or_the_one_asked_for(tmp_path):
    model = small_model(dtype="mixed_bfloat16")
    path = save_to_preset(model, tmp_path / "p")
    assert from_preset(path).dtype_policy.name == "mixed_bfloat16"
    float32 = from_preset(path, dtype="float32")
    assert float32.dtype_policy.name == "float32"
    for saved, loaded in zip(model.get_weights(), float32.get_weights()):
        np.testing.assert_array_equal(saved, loaded)


def test_fresh_weights_on_request(tmp_path):
    path = save_to_preset(small_model(), tmp_path / "p")
    keras.utils.set_random_seed(7)
    fresh = from_preset(path, load_weights=False)
    assert any(not np.array_equal(a, b) for a, b in zip(fresh.get_weights(), small_model().get_weights()))


def test_an_existing_preset_is_never_overwritten_unless_asked(tmp_path):
    path = save_to_preset(small_model(), tmp_path / "p")
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    other = small_model(num_layers=2)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_to_preset(other, path)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    save_to_preset(other, path, overwrite=True)
    assert from_preset(path).config.num_layers == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]  # no staging or replaced preset left


def test_a_preset_published_meanwhile_by_another_save_is_kept(tmp_path, monkeypatch):
    other = small_model(num_layers=2)
    real_save = type(other).save_weights
    published = []

    def another_save_publishes_first(self, path):
        if not published:
            published.append(tmp_path / "p")
            save_to_preset(other, tmp_path / "p")
        real_save(self, path)

    monkeypatch.setattr(type(other), "save_weights", another_save_publishes_first)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_to_preset(small_model(), tmp_path / "p")
    assert from_preset(tmp_path / "p").config.num_layers == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]


def test_only_models_of_the_zoo_are_saved():
    plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="keras_attnconv model.*Received: model of class Sequential"):
        save_to_preset(plain, "unused")


def test_an_interrupted_save_leaves_no_preset(tmp_path, monkeypatch):
    model = small_model()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing the weights")

    monkeypatch.setattr(model, "save_weights", killed)
    with pytest.raises(KeyboardInterrupt):
        save_to_preset(model, tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


# A preset is written beside its place and renamed into it: what a kill leaves is the same on every backend.
@pytest.mark.backend_independent
def test_a_sigkill_at_any_moment_leaves_a_whole_preset_or_none(tmp_path):
    # A process saves presets p0, p1, ... until it is killed; each one found must load, and the next save
    # removes the killed process's staging directory.
    script = textwrap.dedent(f"""
        import itertools, sys
        from keras_attnconv import build_model, save_to_preset
        model = build_model("quadratic_tiny", seed=0, **{SMALL!r})
        for index in itertools.count():
            save_to_preset(model, {str(tmp_path)!r} + f"/p{{index}}")
            print(index, flush=True)
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    process = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "0", "the first preset was never saved"
    time.sleep(0.137)  # somewhere inside a later save
    process.send_signal(signal.SIGKILL)
    process.wait()
    for path in tmp_path.iterdir():
        if not path.name.startswith("."):
            from_preset(path)
    leftovers = {path.name.split(".")[1] for path in tmp_path.iterdir() if path.name.startswith(".")}
    for name in leftovers:  # the preset being written when the process was killed
        save_to_preset(small_model(), tmp_path / name, overwrite=True)
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []


@pytest.mark.parametrize(
    "damage, error, message",
    [
        (lambda p: (p / "model.weights.h5").unlink(), FileNotFoundError, "lacks model.weights.h5"),
        (lambda p: (p / "config.json").write_text("{"), ValueError, "config.json cannot be read"),
        (
            lambda p: (p / "model.weights.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 40),
            ValueError,
            "weights of the preset .* cannot be loaded",
        ),
        (
            lambda p: (p / "config.json").write_text(
                json.dumps(
                    {
                        "module": "keras.layers",
                        "class_name": "Lambda",
                        "registered_name": None,
                        "config": {"function": "print"},
                    }
                )
            ),
            ValueError,
            "does not hold a keras_attnconv model",
        ),
    ],
)
def test_a_damaged_or_foreign_preset_is_an_error_naming_it(tmp_path, damage, error, message):
    path = save_to_preset(small_model(), tmp_path / "p")
    damage(path)
    with pytest.raises(error, match=message) as raised:
        from_preset(path)
    assert f"preset={str(path)!r}" in str(raised.value) or "Received: registered_name=None" in str(raised.value)


def test_a_missing_preset_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"preset='{tmp_path / 'none'}'"):
        from_preset(tmp_path / "none")


def users_folder(path):
    (path / "photos").mkdir(parents=True)
    (path / "notes.txt").write_text("mine")
    return path


def a_run(path):
    RunDirectory(path).claim()
    (path / "config.json").write_text("{}")
    return path


@pytest.mark.parametrize(
    "make, holds",
    [
        (users_folder, r"files without keras_attnconv's mark \(notes.txt, photos\)"),
        (a_run, "a training run directory"),
    ],
)
def test_overwrite_replaces_a_preset_and_nothing_else(tmp_path, make, holds):
    path = make(tmp_path / "userdata")
    before = snapshot(tmp_path)
    with pytest.raises(ForeignDirectoryError, match=f"{path} holds {holds}, not a preset directory"):
        save_to_preset(small_model(), path, overwrite=True)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "call",
    [
        lambda path: save_to_preset(small_model(), path, overwrite="no"),
        lambda path: from_preset(save_to_preset(small_model(), path), load_weights="no"),
    ],
)
def test_a_flag_is_a_real_boolean(tmp_path, call):
    with pytest.raises(ValueError, match="must be true or false. Received: .*='no'"):
        call(tmp_path / "p")


def test_a_preset_of_an_earlier_version_without_the_mark_is_replaced_when_asked(tmp_path):
    path = save_to_preset(small_model(), tmp_path / "p")
    (path / MARKER).unlink()  # as earlier versions wrote them
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_to_preset(small_model(num_layers=2), path)
    save_to_preset(small_model(num_layers=2), path, overwrite=True)
    assert from_preset(path).config.num_layers == 2 and (path / MARKER).exists()


def test_overwriting_through_a_symlink_replaces_the_preset_it_points_to(tmp_path):
    target = save_to_preset(small_model(), tmp_path / "target")
    (tmp_path / "link").symlink_to(target)
    save_to_preset(small_model(num_layers=2), tmp_path / "link", overwrite=True)
    assert (tmp_path / "link").is_symlink() and from_preset(target).config.num_layers == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "target"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_preset_is_published_only_once_its_metadata_is_written(tmp_path, monkeypatch, overwrite):
    from keras_attnconv.models import presets

    if overwrite:
        save_to_preset(small_model(), tmp_path / "p")
    published = []

    def record(rename):
        def wrapped(source, target):
            if Path(target) == tmp_path / "p":
                published.append(sorted(p.name for p in Path(source).iterdir()))
            return rename(source, target)

        return wrapped

    monkeypatch.setattr(presets.os, "rename", record(os.rename))
    monkeypatch.setattr(presets, "exchange", record(presets.exchange))
    save_to_preset(small_model(num_layers=2), tmp_path / "p", overwrite=overwrite)
    assert published and published[0] == [MARKER, "config.json", "metadata.json", "model.weights.h5"]


KILLED_OVERWRITE = """
from keras_attnconv import build_model, save_to_preset
from keras_attnconv.models import presets
save_to_preset(build_model("quadratic_tiny", seed=0, **{small!r}), {path!r})
{kill}
save_to_preset(build_model("quadratic_tiny", seed=0, **{small!r}, dropout=0.25), {path!r}, overwrite=True)
"""


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "kill, dropout", [("die_before(presets, 'exchange')", 0.1), ("die_after(presets, 'exchange')", 0.25)]
)
def test_a_kill_while_a_preset_is_replaced_leaves_the_old_or_the_new_one(tmp_path, kill, dropout):
    path = tmp_path / "p"
    run_until_killed(KILLED_OVERWRITE.format(small=SMALL, path=str(path), kill=kill))
    assert from_preset(path).config.dropout == dropout
    assert any(p.name.startswith(".") for p in tmp_path.iterdir())  # the killed save's staging
    save_to_preset(small_model(), path, overwrite=True)  # the next save works, and removes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]


def with_metadata(**changes):
    def damage(path):
        metadata = json.loads((path / "metadata.json").read_text())
        (path / "metadata.json").write_text(json.dumps({**metadata, **changes}))

    return damage


def with_weights_of(**overrides):
    def damage(path):
        other = save_to_preset(small_model(**overrides), path.parent / "other")
        (path / "model.weights.h5").write_bytes((other / "model.weights.h5").read_bytes())

    return damage


def test_a_compiled_models_preset_holds_the_model_alone_and_the_model_keeps_its_optimizer(tmp_path):
    import h5py

    model = small_model()
    model.compile(optimizer="sgd", loss="mse")
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)  # Keras' save_weights would save its state beside the weights
    preset = save_to_preset(model, tmp_path / "p")
    with h5py.File(preset / "model.weights.h5", "r") as weights:
        assert sorted(weights) == ["layers", "vars"]  # no "optimizer": a preset is the model, not its training
    assert model.optimizer is optimizer
    np.testing.assert_array_equal(outputs(from_preset(preset), images()), outputs(model, images()))
    # A preset written before, with the optimizer's state in its weights file, still loads.
    model.save_weights(preset / "model.weights.h5")
    with h5py.File(preset / "model.weights.h5", "r") as weights:
        assert "optimizer" in weights
    np.testing.assert_array_equal(outputs(from_preset(preset), images()), outputs(model, images()))


def without_a_weight(path):
    import h5py

    with h5py.File(path / "model.weights.h5", "r+") as weights:
        del weights["layers/transformer_encoder_block/output_norm/vars/1"]


@pytest.mark.parametrize(
    "damage, disagreement",
    [
        (
            with_weights_of(num_layers=2),
            "model.weights.h5 holds 32 weights .* has 18 weights",
        ),  # extra: Keras drops them
        (with_weights_of(hidden_dim=12, intermediate_dim=12), r"holds 18 weights \(2046 values\) .* \(990 values\)"),
        (without_a_weight, "model.weights.h5 holds 17 weights .* has 18 weights"),
        (
            with_metadata(model="resnet18"),
            "metadata.json says model='resnet18' where config.json builds model='quadratic_tiny'",
        ),
        (with_metadata(**{"class": "keras_attnconv>ResNet"}), "says class='keras_attnconv>ResNet'"),
        (with_metadata(parameter_count=12), "says parameter_count=12 where config.json builds parameter_count=990"),
        (with_metadata(preprocessing={"class_names": ["a", "b", "c"]}), "says preprocessing="),
    ],
)
def test_a_preset_whose_files_disagree_is_an_error_naming_what_disagrees(tmp_path, damage, disagreement):
    path = save_to_preset(small_model(), tmp_path / "p")
    damage(path)
    with pytest.raises(ValueError, match=f"The preset '{path}' disagrees with itself: .*{disagreement}"):
        from_preset(path)


@pytest.mark.parametrize(
    "content, holds",
    [
        ("[1, 2]", "holds a JSON list, not an object"),
        ("[" * 100_000 + "]" * 100_000, "cannot be read .JSON nested too deeply"),
    ],
)
def test_a_metadata_file_that_is_not_an_object_is_named(tmp_path, content, holds):
    path = save_to_preset(small_model(), tmp_path / "p")
    (path / "metadata.json").write_text(content)
    for load in (from_preset, load_preset_metadata):
        with pytest.raises(ValueError, match=f"{path / 'metadata.json'} {holds}.* Received: preset='{path}'"):
            load(path)


def test_a_run_given_as_a_preset_points_to_its_preset(tmp_path):
    run = RunDirectory(tmp_path / "run")
    run.claim()
    save_to_preset(small_model(), run.preset_dir)
    with pytest.raises(
        FileNotFoundError,
        match=f"'{run.path}' is a training run directory, not a preset: its preset is '{run.preset_dir}'",
    ):
        from_preset(run.path)


@pytest.mark.parametrize(
    "name, message",
    [
        ("a\0b", "cannot hold a NUL byte"),
        ("x" * 300, "has a name of 300 characters"),
    ],
)
def test_a_preset_path_the_system_cannot_take_is_named(tmp_path, name, message):
    with pytest.raises(ValueError, match=f"`preset_dir` {message}"):
        save_to_preset(small_model(), tmp_path / name)
    with pytest.raises(ValueError, match=f"`preset` {message}"):
        from_preset(tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def read_only(path, monkeypatch):
    """Makes `path` read-only, also for root (which ignores file modes): as os.access answers another user."""
    path.chmod(0o555)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != path and real_access(p, mode))


def test_a_preset_under_a_file_or_a_read_only_folder_is_named_as_given(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("mine")
    with pytest.raises(NotADirectoryError, match=f"preset_dir='{tmp_path / 'file' / 'p'}'.*is a file"):
        save_to_preset(small_model(), tmp_path / "file" / "p")
    locked = tmp_path / "locked"
    locked.mkdir()
    read_only(locked, monkeypatch)
    try:
        with pytest.raises(PermissionError, match=f"preset_dir='{locked / 'p'}': {locked} is not writable"):
            save_to_preset(small_model(), locked / "p")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize(
    "where, preset_dir, overwrite",
    [
        ("p", ".", True),  # was OSError "Device or resource busy" on an exchange with "."
        ("p", "absolute", True),  # was replaced, leaving the process in a removed directory
        ("p", "symlink", True),
        ("empty", ".", False),
        ("p/inside", "..", True),
    ],
)
def test_the_working_directory_is_refused_as_preset_dir_naming_it(tmp_path, monkeypatch, where, preset_dir, overwrite):
    save_to_preset(small_model(), tmp_path / "p")
    (tmp_path / "p" / "inside").mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / where)
    given = {"absolute": str(tmp_path / where), "symlink": str(tmp_path / "link")}.get(preset_dir, preset_dir)
    monkeypatch.chdir(tmp_path / where)
    before = snapshot(tmp_path)
    with pytest.raises(ValueError) as raised:
        save_to_preset(small_model(num_layers=2), given, overwrite=overwrite)
    assert str(raised.value).startswith(f"preset_dir={given!r} is the working directory {tmp_path / where} or holds")
    assert str(raised.value).endswith(f"Received: preset_dir={given!r}")
    assert snapshot(tmp_path) == before and Path.cwd() == tmp_path / where


@pytest.mark.parametrize(
    "metadata, says",
    [
        ([1, 2], "must be None or a dict of fields (a JSON object) added to metadata.json. Received: metadata=[1, 2]"),
        (
            "recipe",
            "must be None or a dict of fields (a JSON object) added to metadata.json. Received: metadata='recipe'",
        ),
        (
            {"tags": {"a"}},
            "must hold JSON values only: Object of type set is not JSON serializable. "
            "Received: metadata={'tags': {'a'}}",
        ),
    ],
)
def test_metadata_that_is_no_json_object_is_named_and_nothing_written(tmp_path, metadata, says):
    with pytest.raises(ValueError) as raised:
        save_to_preset(small_model(), tmp_path / "p", metadata=metadata)
    assert str(raised.value) == f"`metadata` {says}"
    assert list(tmp_path.iterdir()) == []
