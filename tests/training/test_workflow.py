"""`attnconv train` = train, then export: a run killed during its export is exported, not retrained,
when the same command runs again."""

import json
from pathlib import Path

import keras
import pytest
from support import tensorflow_backend_only, tiny_train_command

from keras_attnconv import export
from keras_attnconv.training import workflow
from keras_attnconv.training.recipe import TrainConfig, load_recipe
from keras_attnconv.training.run_directory import RunDirectory
from keras_attnconv.utils.ownership import write_mark


def exported_run_config(small_npz, tmp_path):
    """A one-epoch run of a one-layer tiny model, into tmp_path/runs/small, exported to tmp_path/saved."""
    return TrainConfig(
        name="small",
        model="quadratic_tiny",
        dataset=small_npz,
        epochs=1,
        batch_size=40,
        model_overrides={"num_layers": 1, "hidden_dim": 8, "intermediate_dim": 8},
        runs_dir=str(tmp_path / "runs"),
        export_dir=str(tmp_path / "saved"),
        verbose=0,
        jit_compile=False,
    )


@tensorflow_backend_only("an export traces the model with TensorFlow")
def test_a_run_killed_during_its_export_is_exported_not_retrained(small_npz, tmp_path, monkeypatch):
    config = exported_run_config(small_npz, tmp_path)
    published = workflow.export_source

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed during the export")

    monkeypatch.setattr(workflow, "export_source", killed)
    with pytest.raises(KeyboardInterrupt):
        workflow.train_and_export(config)
    run = tmp_path / "runs" / "small"
    assert (run / "metrics.json").exists() and not (run / RunDirectory.EXPORT_RECORD).exists()

    monkeypatch.setattr(workflow, "export_source", published)
    monkeypatch.setattr(workflow, "train", lambda config: pytest.fail("a finished run must not be retrained"))
    metrics = workflow.train_and_export(config)
    assert Path(metrics["run_dir"]) == run and Path(metrics["export"]) == tmp_path / "saved" / "quadratic_tiny" / "1"
    assert json.loads((run / RunDirectory.EXPORT_RECORD).read_text())["export"] == metrics["export"]
    assert workflow.unexported_run(config) is None  # exported: the next run of the command trains anew


@tensorflow_backend_only("an export traces the model with TensorFlow")
def test_a_second_run_is_exported_but_not_served_until_asked(small_npz, tmp_path, capsys):
    config = exported_run_config(small_npz, tmp_path)
    first, second = workflow.train_and_export(config), workflow.train_and_export(config)
    assert (Path(first["export"]).name, Path(second["export"]).name) == ("1", "2")
    assert export.served_version(tmp_path / "saved", "quadratic_tiny") == 1  # the experiment does not replace it
    assert (
        f"models.config serves version 1 of quadratic_tiny. To serve this one: attnconv serve quadratic_tiny 2 "
        f"--export-dir {tmp_path / 'saved'}"
    ) in capsys.readouterr().err


def test_another_configuration_is_not_taken_for_the_unexported_run(small_npz, tmp_path):
    run = tmp_path / "runs" / "small"
    write_mark(run, "run")
    config = TrainConfig(name="small", dataset=small_npz, runs_dir=str(tmp_path / "runs"))
    (run / "config.json").write_text(json.dumps({**vars(config), "run_dir": str(run), "epochs": 3}))
    (run / "metrics.json").write_text("{}")
    assert workflow.unexported_run(config) is None


def test_without_tensorflow_the_run_trains_on_jax_and_says_how_to_export_later(
    small_npz, tmp_path, jax_without_tensorflow
):
    # Training runs on every backend, and without TensorFlow or TensorBoard installed (the GPU machine
    # has no TensorFlow); a SavedModel needs TensorFlow's.
    import subprocess
    import sys

    command = [
        sys.executable,
        "-m",
        "keras_attnconv.cli",
        *tiny_train_command(small_npz, tmp_path / "run", tmp_path / "saved", jit_compile="auto"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=jax_without_tensorflow)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout[result.stdout.index("{\n") :])  # after the epoch lines
    assert summary["optimizer_steps"] == 4 and summary["export"] is None
    assert f"KERAS_BACKEND=tensorflow attnconv export {tmp_path / 'run'} --export-dir" in result.stderr
    assert not (tmp_path / "saved").exists()


@pytest.mark.parametrize("where", ["file/saved", "photos"], ids=["under a file", "a user's folder"])
def test_on_jax_the_export_root_is_checked_before_training_all_the_same(small_npz, tmp_path, monkeypatch, where):
    # The export is left for later there (it needs TensorFlow), and the run used to train, then give the command of an
    # export into a root it could never write.
    from keras_attnconv.utils.ownership import ForeignDirectoryError

    (tmp_path / "file").write_text("")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "holiday.jpg").write_text("")
    config = load_recipe("quick", epochs=1, run_dir=str(tmp_path / "run"), export_dir=str(tmp_path / where))
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    error = NotADirectoryError if where == "file/saved" else ForeignDirectoryError
    with pytest.raises(error, match=f"export_dir='{tmp_path / where}'"):
        workflow.train_and_export(config)
    assert not (tmp_path / "run").exists()


def test_export_names_the_backend_it_needs(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(RuntimeError, match="needs the TensorFlow backend; Keras runs on 'jax'"):
        export.export_registered("quadratic_tiny", "unused")


def chance_preset(path, accuracy, examples, **metrics):
    """A preset whose recorded metrics say `accuracy` on `examples` validation images (10 classes)."""
    from keras_attnconv import build_model, save_to_preset

    model = build_model("quadratic_tiny", num_layers=1, hidden_dim=8, intermediate_dim=8)
    recorded = {"epoch": 3, "eval_accuracy": accuracy, **({"eval_examples": examples} if examples else {}), **metrics}
    return save_to_preset(model, path, metadata={"weights": "trained: the best epoch", "metrics": recorded})


def metadata_of(version):
    return json.loads((version / "assets.extra" / "metadata.json").read_text())


@tensorflow_backend_only("an export traces the model with TensorFlow")
def test_a_preset_at_chance_is_exported_only_when_asked_and_its_metadata_says_so(tmp_path, capsys):
    from keras_attnconv.cli import main

    preset, root = chance_preset(tmp_path / "preset", 0.1, 500), tmp_path / "saved"
    assert main(["export", str(preset), "--export-dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "learned nothing" in err and "--allow-chance" in err
    assert r"accuracy 0.1000 on 500 images is at chance, 1/10 ± 2 s.e. = [0.0732, 0.1268]" in err
    assert not root.exists()  # refused before any work
    assert main(["export", str(preset), "--export-dir", str(root), "--allow-chance"]) == 0
    metadata = metadata_of(root / "quadratic_tiny" / "1")
    assert metadata["allow_chance"] is True and metadata["metrics"]["eval_accuracy"] == 0.1
    at_chance = metadata["at_chance"]
    assert (at_chance["eval_accuracy"], at_chance["eval_examples"], at_chance["classes"]) == (0.1, 500, 10)
    assert at_chance["chance_interval"] == pytest.approx([0.0732, 0.1268], abs=1e-4)


@tensorflow_backend_only("an export traces the model with TensorFlow")
def test_a_preset_above_chance_or_with_too_few_images_to_tell_is_exported_without_the_flag(tmp_path):
    root = tmp_path / "saved"
    for name, accuracy, examples in (("learned", 0.3, 500), ("few", 0.1, 40), ("unrecorded", 0.1, None)):
        path = workflow.export_source(chance_preset(tmp_path / name, accuracy, examples), root)
        assert "at_chance" not in metadata_of(path) and "allow_chance" not in metadata_of(path)


def test_a_run_that_recorded_its_images_only_in_metrics_json_is_checked_too(tmp_path):
    # A run finished before presets recorded eval_examples: its metrics.json has them (the same split).
    from keras_attnconv.training.callbacks import NothingLearnedError

    run = RunDirectory(tmp_path / "run")
    run.claim()
    chance_preset(run.preset_dir, 0.1, None, eval_split="validation")
    metadata = json.loads((run.preset_dir / "metadata.json").read_text())
    (run.preset_dir / "metadata.json").write_text(json.dumps({**metadata, "training_run": ".."}))
    run.write_metrics({"eval_accuracy": 0.12, "eval_examples": 500})
    with pytest.raises(NothingLearnedError, match=f"{run} holds a model that learned nothing.*--allow-chance"):
        workflow.export_source(run.path, tmp_path / "saved")
    assert not (tmp_path / "saved").exists()


@tensorflow_backend_only("an export traces the model with TensorFlow")
def test_initial_weights_are_exported_as_such_and_the_chance_flag_is_for_a_run_or_preset(tmp_path, capsys):
    from keras_attnconv.cli import main

    root = tmp_path / "saved"
    assert main(["export", "--model", "quadratic_tiny", "--export-dir", str(root), "--allow-chance"]) == 2
    assert "--allow-chance exports a run or preset" in capsys.readouterr().err and not root.exists()
    assert main(["export", "--model", "quadratic_tiny", "--export-dir", str(root)]) == 0
    metadata = metadata_of(root / "quadratic_tiny" / "1")
    assert metadata["weights"] == "initial (untrained): built by build_model, not trained"
    assert "metrics" not in metadata and "allow_chance" not in metadata


@tensorflow_backend_only("seed 2's initial model scores above chance there, and it exports")
def test_a_finished_run_that_never_left_its_warmup_is_not_exported(tmp_path, monkeypatch):
    # The official schedule holds the rate of each epoch's first step: with a warm-up longer than the run, the stop
    # never judges it. Its first epoch trains at rate 0, so its weights are the initial ones, which with this seed
    # score above chance (16.8% on the 500 images); the second, at a rate far too high, collapses to chance. That
    # first epoch is never the best checkpoint: the run's best model is the collapsed one, refused at the export.
    from keras_attnconv.training.callbacks import NothingLearnedError, at_chance, csv_history

    run, root = tmp_path / "run", tmp_path / "saved"
    config = load_recipe(
        "quick",
        epochs=2,
        steps_per_epoch=2,
        schedule="official",
        warmup_ratio=0.9,  # 5 steps of the schedule's 6: the run's 4 steps never leave it
        learning_rate=30.0,
        seed=2,
        jit_compile=False,
        model_overrides={"num_layers": 1},  # the run and its export are the test's time: one block is enough
        run_dir=str(run),
        export_dir=str(root),
        verbose=0,
    )
    with pytest.raises(NothingLearnedError, match=f"attnconv export {run} --allow-chance"):
        workflow.train_and_export(config)
    untrained, collapsed = csv_history(run / "history.csv")["val_accuracy"]
    assert at_chance(untrained, 10, 500) is None and at_chance(collapsed, 10, 500) is not None
    assert json.loads((run / "checkpoints" / "best.json").read_text())["epoch"] == 2
    assert (run / "metrics.json").exists() and not (run / RunDirectory.EXPORT_RECORD).exists()
    assert not root.exists()
    # On JAX (a GPU machine's backend) the export is left for later, with TensorFlow: the run is refused there too,
    # where it used to finish with that later export's command, which would refuse it.
    with monkeypatch.context() as jax:
        jax.setattr(keras.backend, "backend", lambda: "jax")
        with pytest.raises(NothingLearnedError, match=f"KERAS_BACKEND=tensorflow attnconv export {run} --allow-chance"):
            workflow.export_run(config, RunDirectory(run))
    path = workflow.export_source(run, root, allow_chance=True)
    assert metadata_of(path)["at_chance"]["eval_examples"] == 500


def test_a_run_of_one_epoch_at_rate_zero_is_refused_before_anything_is_written(tmp_path, capsys):
    # The official schedule with a warm-up holds the first epoch at rate 0: one epoch would learn nothing.
    from keras_attnconv.cli import main

    run = tmp_path / "run"
    command = ["train", "--recipe", "quick", "--schedule", "official", "--epochs", "1", "--run-dir", str(run)]
    assert main(command) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "trains every step at learning rate 0" in message and "Received: epochs=1, schedule='official'" in message
    assert not run.exists()


KILLED_TRAIN = """
from keras_attnconv import cli
from keras_attnconv.export.root import ExportRoot
from keras_attnconv.training.run_directory import RunDirectory
{kill}
cli.main({command!r})
"""

#: Where `attnconv train` dies once its SavedModel is published: before models.config is merged, or after it
#: and before the run's export.json is written.
PUBLISHED_KILLS = {
    "before models.config is merged": "die_before(ExportRoot, 'update_models_config')",
    "before export.json is written": "die_before(RunDirectory, 'record_export')",
}


@tensorflow_backend_only("an export traces the model with TensorFlow")
@pytest.mark.parametrize("kill", PUBLISHED_KILLS.values(), ids=PUBLISHED_KILLS.keys())
@pytest.mark.parametrize("export_name", [None, "tiny-cifar"], ids=["the model's name", "a serving name"])
def test_a_run_killed_after_its_export_was_published_is_recorded_not_published_again(
    small_npz, tmp_path, kill, export_name, monkeypatch
):
    from support import run_until_killed

    from keras_attnconv import cli

    run, root, served = tmp_path / "run", tmp_path / "saved", export_name or "quadratic_tiny"
    command = tiny_train_command(small_npz, run, root, **({"export_name": export_name} if export_name else {}))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))
    run_until_killed(KILLED_TRAIN.format(kill=kill, command=command))
    assert (root / served / "1" / "saved_model.pb").exists()
    assert not (run / RunDirectory.EXPORT_RECORD).exists()

    assert cli.main(command) == 0  # the same command: the published version is found and recorded
    assert export.ExportRoot(root).versions(served) == [1]
    assert json.loads((run / RunDirectory.EXPORT_RECORD).read_text())["export"] == str(root / served / "1")
    assert export.served_version(root, served) == 1


@pytest.mark.parametrize(
    "run_dir, export_dir, runs_dir",
    [
        ("same", "same", None),
        ("saved/run", "saved", None),
        ("run", "run/saved", None),
        (None, "saved", "saved/runs"),
    ],
)
def test_a_run_directory_and_export_root_inside_one_another_are_refused_before_training(
    small_npz, tmp_path, capsys, run_dir, export_dir, runs_dir
):
    from keras_attnconv import cli

    paths = {
        name: tmp_path / value if value else None
        for name, value in (("run_dir", run_dir), ("export_dir", export_dir), ("runs_dir", runs_dir))
    }
    assert cli.main(tiny_train_command(small_npz, paths["run_dir"], paths["export_dir"], paths["runs_dir"])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(paths["export_dir"]) in err
    assert str(paths["run_dir"] or paths["runs_dir"]) in err and "Received:" in err
    assert list(tmp_path.iterdir()) == []  # before any run exists


def three_classes_beside_ten(small_npz, tmp_path):
    """An export root holding the 10-class registered model's version 1, and a .npz of 3 of its classes: (root, npz)."""
    import numpy as np
    from support import SMALL_MODEL

    from keras_attnconv import build_model

    root = tmp_path / "saved_models"
    export.export_model(build_model("quadratic_tiny", image_size=8, **SMALL_MODEL), root, warmup=False)
    data = np.load(small_npz)
    three = {f"{k}_{split}": data[f"{k}_{split}"][data[f"y_{split}"] < 3] for k in "xy" for split in ("train", "test")}
    np.savez(tmp_path / "three.npz", **three)
    return root, str(tmp_path / "three.npz")


@tensorflow_backend_only("the export, and its check before the training, need TensorFlow")
def test_a_run_whose_model_would_answer_other_classes_than_its_names_versions_is_refused_before_it_trains(
    small_npz, tmp_path
):
    from support import small_config

    root, three = three_classes_beside_ten(small_npz, tmp_path)
    config = small_config(three, tmp_path / "run", export_dir=str(root))
    with pytest.raises(ValueError, match=r"quadratic_tiny holds version 1, whose classes \(airplane, .*\) are not"):
        workflow.train_and_export(config)
    assert not (tmp_path / "run").exists()


@tensorflow_backend_only("the export needs TensorFlow")
def test_a_run_of_other_classes_is_exported_under_the_name_it_is_given_beside_the_registered_models_versions(
    small_npz, tmp_path
):
    from support import small_config

    root, three = three_classes_beside_ten(small_npz, tmp_path)
    config = small_config(three, tmp_path / "run", export_dir=str(root), export_name="three-classes")
    metrics = workflow.train_and_export(config)
    assert Path(metrics["export"]) == root / "three-classes" / "1"
    recorded = metadata_of(root / "three-classes" / "1")
    assert (recorded["serving_name"], recorded["model"]) == ("three-classes", "quadratic_tiny")
    assert recorded["preprocessing"]["class_names"] == ["0", "1", "2"]  # the .npz names no classes
    assert sorted(p.name for p in (root / "quadratic_tiny").iterdir() if p.name.isdigit()) == ["1"]  # left alone
    assert export.served_version(root, "three-classes") == 1
    assert workflow.unexported_run(config) is None  # its export is recorded: the same command trains anew
