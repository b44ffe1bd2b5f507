"""Specifications of the training choices beyond the paper: label smoothing, weight averaging (`ema_momentum`),
cutout and test-time flips (the model's `test_time_flips`, which every run measures both ways)."""

import json

import keras
import numpy as np
import pytest
from support import SMALL_MODEL, small_config

from keras_attnconv import from_preset
from keras_attnconv.optim import LabelSmoothingCrossentropy
from keras_attnconv.training.fit import run_loss, train
from keras_attnconv.training.plan import plan_run
from keras_attnconv.training.recipe import TrainConfig, load_recipe
from keras_attnconv.training.runs import same_run

#: Few steps with a short average (momentum 0.5), so that the averaged weights differ clearly from the trained ones.
CHOICES = {
    "label smoothing": {"label_smoothing": 0.2},
    "weight averaging": {"ema_momentum": 0.5},
    "both": {"label_smoothing": 0.2, "ema_momentum": 0.5},
}


def _best_epoch_evaluation(run, config):
    """The run's best checkpoint evaluated with the run's loss, and that epoch's validation figures from history.csv."""
    best = keras.saving.load_model(run / "checkpoints" / "best.keras", compile=False)
    best.compile(loss=run_loss(config), metrics=["accuracy"])
    loss, accuracy = best.evaluate(plan_run(config).eval_batches, verbose=0)
    epoch = json.loads((run / "checkpoints" / "best.json").read_text())["epoch"]
    rows = (run / "history.csv").read_text().splitlines()
    header, row = rows[0].split(","), rows[epoch].split(",")
    logged = dict(zip(header, row))
    return (loss, accuracy), (float(logged["val_loss"]), float(logged["val_accuracy"]))


@pytest.mark.parametrize("choice", CHOICES)
def test_the_best_checkpoint_holds_the_weights_that_were_validated_with_the_runs_loss(choice, small_npz, tmp_path):
    # The epoch's validation loss is recomputed from the saved checkpoint: with weight averaging both must be the
    # averaged weights (the trained ones give another loss), with label smoothing both the smoothed loss.
    config = small_config(small_npz, tmp_path / "run", steps_per_epoch=4, **CHOICES[choice])
    train(config)
    (loss, accuracy), (logged_loss, logged_accuracy) = _best_epoch_evaluation(tmp_path / "run", config)
    assert loss == pytest.approx(logged_loss, rel=1e-5)
    assert accuracy == pytest.approx(logged_accuracy, abs=1e-6)


def test_weight_averaging_changes_what_is_validated_and_kept_but_not_what_is_trained(small_npz, tmp_path):
    plain = small_config(small_npz, tmp_path / "plain", steps_per_epoch=4)
    averaged = small_config(small_npz, tmp_path / "averaged", steps_per_epoch=4, ema_momentum=0.5)
    train(plain)
    train(averaged)
    plain_history = json.loads((tmp_path / "plain" / "metrics.json").read_text())["history"]
    averaged_history = json.loads((tmp_path / "averaged" / "metrics.json").read_text())["history"]
    # The same training steps (the averages never feed back into training): the same training losses.
    np.testing.assert_allclose(averaged_history["loss"], plain_history["loss"], rtol=1e-5)
    assert averaged_history["val_loss"] != pytest.approx(plain_history["val_loss"], rel=1e-4)
    # The backup holds the trained weights, which a resumed run trains on: those of the plain run.
    plain_backup = np.load(tmp_path / "plain" / "backup" / "epoch-00002" / "model.npz")
    averaged_backup = np.load(tmp_path / "averaged" / "backup" / "epoch-00002" / "model.npz")
    for name in plain_backup.files:
        np.testing.assert_allclose(averaged_backup[name], plain_backup[name], rtol=1e-5, atol=1e-6)


def test_with_weight_averaging_the_final_weights_are_the_averages_and_what_was_evaluated_at_the_end(
    small_npz, tmp_path
):
    metrics = train(small_config(small_npz, tmp_path / "run", steps_per_epoch=4, ema_momentum=0.5))
    # Keras puts the averages into the model at the end of fit: the final evaluation is that of the last epoch's
    # validation, which ran on the averages.
    assert metrics["eval_loss"] == pytest.approx(metrics["history"]["val_loss"][-1], rel=1e-5)


def test_a_label_smoothed_checkpoint_reloads_with_its_loss(small_npz, tmp_path):
    train(small_config(small_npz, tmp_path / "run", epochs=1, steps_per_epoch=2, label_smoothing=0.1))
    reloaded = keras.saving.load_model(tmp_path / "run" / "checkpoints" / "best.keras")  # compiled, as saved
    assert isinstance(reloaded.loss, LabelSmoothingCrossentropy)
    assert reloaded.loss.label_smoothing == 0.1


def test_the_paper_recipes_keep_the_papers_loss_weights_and_augmentation():
    config = load_recipe("quadratic")
    assert (config.label_smoothing, config.ema_momentum, config.cutout) == (0.0, 0.0, 0)
    assert isinstance(run_loss(config), keras.losses.SparseCategoricalCrossentropy)


@pytest.mark.parametrize(
    "field, value",
    [
        ("label_smoothing", 1.0),
        ("label_smoothing", -0.1),
        ("ema_momentum", 1.0),
        ("cutout", -1),
        ("cutout", 2.5),
        ("cutout", True),
    ],
)
def test_bad_choices_are_named(field, value):
    with pytest.raises(ValueError, match=f"{field}={value!r}"):
        TrainConfig(**{field: value})


def test_a_run_recorded_before_the_choices_existed_is_the_same_run_with_them_off():
    resolved = {**vars(TrainConfig(min_warmup_epochs=0)), "run_dir": "runs/run"}
    recorded_before = {k: v for k, v in resolved.items() if k not in ("label_smoothing", "ema_momentum", "cutout")}
    assert same_run(recorded_before, resolved) == []
    assert same_run(recorded_before, {**resolved, "label_smoothing": 0.1}) == ["label_smoothing"]
    assert same_run(recorded_before, {**resolved, "cutout": 16}) == ["cutout"]
    # A run recorded before the minimum warm-up existed had none: today's default (6 epochs) is another schedule.
    recorded_earlier = {k: v for k, v in recorded_before.items() if k != "min_warmup_epochs"}
    assert same_run(recorded_earlier, resolved) == []
    assert same_run(recorded_earlier, {**resolved, "min_warmup_epochs": 6.0}) == ["min_warmup_epochs"]


def test_a_run_with_cutout_cuts_its_training_batches_with_the_mean_pixel_and_evaluates_whole_images(
    small_npz, tmp_path
):
    plan = plan_run(small_config(small_npz, tmp_path / "run", cutout=3))
    # The square is the pixel the model normalises to about zero, as cutout's zeros after normalisation.
    mean = np.asarray(plan.model_config.pixel_mean)
    np.testing.assert_array_equal(plan.train_batches.cutout_fill, np.round(255 * mean).astype("uint8"))
    assert plan.train_batches.cutout == 3 and plan.eval_batches.cutout == 0
    images = plan.train_batches[0][0]
    assert (images == plan.train_batches.cutout_fill).all(axis=-1).sum(axis=(1, 2)).min() >= 1
    # Its bound is the images' side, checked before a run writes anything.
    side = images.shape[1]
    with pytest.raises(ValueError, match=f"smaller than the images' {side}x{side}. Received: cutout={side}"):
        plan_run(small_config(small_npz, tmp_path / "too large", cutout=side))
    assert not (tmp_path / "too large").exists()


def documented_gains(results_file):
    """The results file of `attnconv choices` and docs/training.md, once each of its runs' rows is found there with
    the gain over its base that the file's accuracies give."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    results = json.loads((root / "training/results" / results_file).read_text())
    documented = (root / "docs/training.md").read_text()
    base = (results.get("base") or results["runs"][0])["test_accuracy"]  # a file of before had its base first
    for run in results["runs"]:
        assert run["gain_points"] == pytest.approx(100 * (run["test_accuracy"] - base))
        row = (
            f"| {run['variant']} | {100 * run['test_accuracy']:.2f}% ± {100 * run['standard_error']:.2f}% | "
            f"{run['gain_points']:+.2f} ± {run['gain_standard_error_points']:.2f} |"
        )
        assert row in documented, row
    return results, documented


def test_the_documented_gains_are_those_of_the_results_file():
    results, documented = documented_gains("choices-cpu.json")
    base = results["runs"][0]["test_accuracy"]
    flips = results["test_time_flips"]
    assert flips["test_accuracy_of_the_run"] == base  # the base run made again
    assert flips["gain"] == pytest.approx(flips["with"] - flips["without"])
    figures = (
        f"{100 * flips['without']:.2f}% without, {100 * flips['with']:.2f}% with, {100 * flips['gain']:+.2f} ± "
        f"{100 * flips['gain_standard_error']:.2f} points (paired: {flips['right_only_with']} test images right only "
        f"with flips, {flips['right_only_without']} only without)"
    )
    assert figures in " ".join(documented.split()), figures


def test_the_documented_fine_tuning_gains_are_those_of_their_results_file():
    results, _ = documented_gains("transfer-cpu.json")
    assert {"init_from", "init_from_digest"} <= set(results["runs"][0]["changes"])  # fine-tuned, from a preset


@pytest.mark.parametrize("flips", [False, True])
def test_every_run_measures_test_time_flips_and_publishes_the_model_it_was_given(
    flips, small_npz, tmp_path, monkeypatch
):
    # One epoch: the best checkpoint holds the final weights, which the metrics evaluated both ways.
    overrides = {**SMALL_MODEL, "test_time_flips": flips}
    config = small_config(small_npz, tmp_path / "run", epochs=1, steps_per_epoch=3, model_overrides=overrides)
    predicting = []
    predict = keras.Model.predict
    monkeypatch.setattr(
        keras.Model, "predict", lambda model, *a, **k: predicting.append(model) or predict(model, *a, **k)
    )
    metrics = train(config)
    monkeypatch.undo()
    # Both ways from one compiled prediction of a model without flips: the images', then their mirror images'.
    assert len(predicting) == 2 and predicting[0] is predicting[1] and not predicting[0].config.test_time_flips
    by_flips = metrics["eval_accuracy_by_test_time_flips"]
    assert metrics["eval_accuracy"] == pytest.approx(by_flips["with" if flips else "without"], abs=1e-6)
    assert by_flips["examples"] == metrics["eval_examples"]
    assert 0 < by_flips["seconds"] < metrics["wall_seconds_this_session"]
    best = keras.saving.load_model(tmp_path / "run" / "checkpoints" / "best.keras", compile=False)
    assert from_preset(tmp_path / "run" / "preset").config.test_time_flips is best.config.test_time_flips is flips
    eval_batches = plan_run(config).eval_batches
    for with_flips in (False, True):
        model = best.with_config(test_time_flips=with_flips)
        model.compile(loss=run_loss(config), metrics=["accuracy"])
        assert model.evaluate(eval_batches, verbose=0)[1] == pytest.approx(by_flips[("without", "with")[with_flips]])
