"""Specifications of a fine-tuning run (`init_from`): it starts from a preset's trained weights, on the classes of
its own dataset, keeps the preset's preprocessing, records what it started from, and refuses before it writes
anything a preset it cannot start from."""

import json

import numpy as np
import pytest
from support import SMALL_MODEL, assert_same_weights_but_the_head, small_config

from keras_attnconv import from_preset
from keras_attnconv.models.presets import load_preset_metadata, preset_digest
from keras_attnconv.training.fit import train
from keras_attnconv.training.recipe import TrainConfig, load_recipe

THREE_CLASSES = ("cat", "dog", "frog")


@pytest.fixture(scope="module")
def trained_run(small_npz, tmp_path_factory):
    """A finished run of the small model on CIFAR-10's 10 classes: its preset is what the runs below start from."""
    run = tmp_path_factory.mktemp("trained") / "run"
    train(small_config(small_npz, run, epochs=1))
    return run


@pytest.fixture(scope="module")
def three_classes(small_npz, tmp_path_factory):
    """The small dataset's images of 3 classes, relabelled 0-2 and named, in another mean colour (+40, clipped)."""
    data = np.load(small_npz)
    arrays = {}
    for split in ("train", "test"):
        keep = data[f"y_{split}"] < 3
        arrays[f"x_{split}"] = np.clip(data[f"x_{split}"][keep].astype(int) + 40, 0, 255).astype(np.uint8)
        arrays[f"y_{split}"] = data[f"y_{split}"][keep]
    path = tmp_path_factory.mktemp("data") / "three.npz"
    np.savez(path, **arrays, class_names=np.array(THREE_CLASSES))
    return str(path)


def fine_tuning(dataset, run_dir, init_from, **overrides):
    """A fine-tuning run of `init_from` on `dataset` so short and slow that it leaves the weights it starts from
    nearly as they were (a rate of 1e-9, no decay, one step)."""
    values = {"init_from": str(init_from), "learning_rate": 1e-9, "weight_decay": 0.0, "warmup_ratio": 0.0}
    return small_config(dataset, run_dir, epochs=1, steps_per_epoch=1, **{**values, **overrides})


def test_a_fine_tuning_run_starts_from_the_presets_weights_with_a_new_head_for_its_classes(
    trained_run, three_classes, tmp_path
):
    preset = from_preset(trained_run / "preset")
    train(fine_tuning(three_classes, tmp_path / "tuned", trained_run))  # a run directory gives its preset
    tuned = from_preset(tmp_path / "tuned" / "preset")
    assert tuned.class_names == THREE_CLASSES and tuned.output_shape == (None, 3)
    assert_same_weights_but_the_head(tuned, preset, atol=1e-6)
    # The preprocessing its features were trained with, not the new dataset's (whose mean is 40/255 higher).
    assert (tuned.config.pixel_mean, tuned.config.pixel_std) == (preset.config.pixel_mean, preset.config.pixel_std)


def test_the_same_number_of_classes_keeps_the_head_and_takes_the_datasets_names(trained_run, small_npz, tmp_path):
    preset = from_preset(trained_run / "preset")
    data = dict(np.load(small_npz))
    names = tuple(f"class {k}" for k in range(10))
    np.savez(tmp_path / "renamed.npz", **data, class_names=np.array(names))
    train(fine_tuning(str(tmp_path / "renamed.npz"), tmp_path / "tuned", trained_run / "preset"))
    tuned = from_preset(tmp_path / "tuned" / "preset")
    assert tuned.class_names == names
    np.testing.assert_allclose(tuned.get_layer("logits").get_weights()[0], preset.get_layer("logits").get_weights()[0])


def test_a_fine_tuning_run_records_the_preset_it_started_from(trained_run, three_classes, tmp_path):
    preset = trained_run / "preset"
    train(fine_tuning(three_classes, tmp_path / "tuned", preset))
    recorded = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert (recorded["init_from"], recorded["init_from_digest"]) == (str(preset), preset_digest(preset))
    metadata = load_preset_metadata(tmp_path / "tuned" / "preset")
    assert metadata["recipe"]["init_from_digest"] == preset_digest(preset)
    assert metadata["weights"].startswith(f"fine-tuned from {preset}: the best epoch")


def test_a_changed_preset_is_another_configuration_for_an_unfinished_run(trained_run, three_classes, tmp_path):
    # The unfinished run of the preset as it was, with a completed epoch: the preset has changed since.
    config = fine_tuning(three_classes, tmp_path / "tuned", trained_run)
    run = tmp_path / "tuned"
    train(config)
    (run / "metrics.json").unlink()  # unfinished, as if killed after its epoch
    recorded = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**recorded, "init_from_digest": "sha256:the preset of before"}))
    with pytest.raises(ValueError, match="init_from_digest: 'sha256:the preset of before' -> 'sha256:.*completed"):
        train(config)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": "gaussian_tiny"}, "`init_from` holds a quadratic_tiny model.*model='gaussian_tiny'"),
        (
            {"model_overrides": {**SMALL_MODEL, "hidden_dim": 32}},
            "keeps the preset's weights.*model_overrides=.*'hidden_dim': 32",
        ),
    ],
    ids=["another model", "another width"],
)
def test_a_preset_the_run_cannot_start_from_is_refused_before_anything_is_written(
    trained_run, three_classes, tmp_path, overrides, message
):
    with pytest.raises(ValueError, match=message):
        train(fine_tuning(three_classes, tmp_path / "tuned", trained_run, **overrides))
    assert not (tmp_path / "tuned").exists()


def test_what_is_no_preset_is_named_as_init_from(three_classes, tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(FileNotFoundError, match="`init_from` must be a preset directory.*init_from='.*folder'"):
        train(fine_tuning(three_classes, tmp_path / "tuned", tmp_path / "folder"))
    assert not (tmp_path / "tuned").exists()


def test_a_damaged_preset_is_named(trained_run, three_classes, tmp_path):
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(trained_run / "preset", damaged)
    (damaged / "model.weights.h5").write_bytes(b"not HDF5")
    with pytest.raises(ValueError, match="The preset of `init_from` cannot be loaded.*damaged"):
        train(fine_tuning(three_classes, tmp_path / "tuned", damaged))
    assert not (tmp_path / "tuned").exists()


def test_init_from_is_a_recipe_field_that_none_leaves_out(tmp_path):
    assert TrainConfig().init_from is None and load_recipe("quick", init_from="none").init_from is None
    assert load_recipe("quick", init_from="runs/quick").init_from == "runs/quick"
    with pytest.raises(ValueError, match="`init_from` must be a non-empty string"):
        TrainConfig(init_from="")


@pytest.mark.parametrize(
    ("name", "accepted"),
    [("quadratic_tiny", True), ("learned_tiny", False)],
    ids=["relative positions computed", "an embedding per relative position"],
)
def test_images_of_another_size_are_refused_only_where_a_weight_depends_on_it(small_npz, tmp_path, name, accepted):
    from keras_attnconv import build_model, save_to_preset
    from keras_attnconv.training.plan import check_run

    save_to_preset(build_model(name, image_size=16, **SMALL_MODEL), tmp_path / "preset")  # the dataset's are 8x8
    config = fine_tuning(small_npz, tmp_path / "tuned", tmp_path / "preset", model=name)
    if accepted:
        assert check_run(config).model_config.image_size == 8
    else:
        with pytest.raises(
            ValueError,
            match=r"keeps the preset's weights, so its dataset \(.*: 8x8 images, 10 classes\).*encoder_0 weight shape",
        ):
            check_run(config)


def test_a_pruned_model_fine_tunes_under_its_own_name_which_results_files_record_with_no_paper_row(
    trained_run, small_npz, tmp_path
):
    # Appendix E: the degenerate heads pruned (here every head but the sharpest of each block), then fine-tuned.
    from keras_attnconv import prune_degenerate_heads, save_to_preset

    pruned, _ = prune_degenerate_heads(from_preset(trained_run / "preset"), max_eigenvalue=1e9)
    save_to_preset(pruned, tmp_path / "pruned")
    train(fine_tuning(small_npz, tmp_path / "tuned", tmp_path / "pruned", model="quadratic_tiny_pruned"))
    tuned = from_preset(tmp_path / "tuned" / "preset")
    assert tuned.name == "quadratic_tiny_pruned" and tuned.config.num_heads == pruned.config.num_heads == (1,)
    assert_same_weights_but_the_head(tuned, pruned, atol=1e-6)
    from keras_attnconv.training.table1 import run_record

    assert run_record(tmp_path / "tuned")["paper_accuracy"] is None  # `attnconv choices` and `table1` read it


def test_the_preset_is_loaded_once_the_strategy_is_made(trained_run, three_classes, tmp_path, monkeypatch):
    # Building the preset's model starts TensorFlow's runtime, and tf.distribute's multi-worker strategy configures
    # its collective ops before that or not at all ("Collective ops must be configured at program startup").
    from keras_attnconv.models import presets
    from keras_attnconv.training import plan

    events, make_strategy, load_preset = [], plan.make_strategy, presets.load_preset
    monkeypatch.setattr(plan, "make_strategy", lambda *a, **k: events.append("strategy") or make_strategy(*a, **k))
    monkeypatch.setattr(presets, "load_preset", lambda *a, **k: events.append("preset") or load_preset(*a, **k))
    plan.plan_run(fine_tuning(three_classes, tmp_path / "tuned", trained_run))
    assert events == ["strategy", "preset"]
