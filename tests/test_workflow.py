"""`attnconv train` = train, then export: a run killed during its export is exported, not retrained,
when the same command runs again."""

import json
from pathlib import Path

import keras
import pytest

from keras_attnconv import export
from keras_attnconv.training import workflow
from keras_attnconv.utils.ownership import write_mark
from keras_attnconv.training.run_directory import RunDirectory
from keras_attnconv.training.recipe import TrainConfig


def test_a_run_killed_during_its_export_is_exported_not_retrained(small_npz, tmp_path, monkeypatch):
    config = TrainConfig(name="small", model="quadratic_tiny", dataset=small_npz, epochs=1, batch_size=40,
                         model_overrides={"num_layers": 1, "hidden_dim": 8, "intermediate_dim": 8},
                         runs_dir=str(tmp_path / "runs"), export_dir=str(tmp_path / "saved"), verbose=0,
                         jit_compile=False)
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


def test_a_second_run_is_exported_but_not_served_until_asked(small_npz, tmp_path, capsys):
    config = TrainConfig(name="small", model="quadratic_tiny", dataset=small_npz, epochs=1, batch_size=40,
                         model_overrides={"num_layers": 1, "hidden_dim": 8, "intermediate_dim": 8},
                         runs_dir=str(tmp_path / "runs"), export_dir=str(tmp_path / "saved"), verbose=0,
                         jit_compile=False)
    first, second = workflow.train_and_export(config), workflow.train_and_export(config)
    assert (Path(first["export"]).name, Path(second["export"]).name) == ("1", "2")
    assert export.served_version(tmp_path / "saved", "quadratic_tiny") == 1  # the experiment does not replace it
    assert (f"models.config serves version 1 of quadratic_tiny. To serve this one: attnconv serve quadratic_tiny 2 "
            f"--export-dir {tmp_path / 'saved'}") in capsys.readouterr().err


def test_another_configuration_is_not_taken_for_the_unexported_run(small_npz, tmp_path):
    run = tmp_path / "runs" / "small"
    write_mark(run, "run")
    config = TrainConfig(name="small", dataset=small_npz, runs_dir=str(tmp_path / "runs"))
    (run / "config.json").write_text(json.dumps({**vars(config), "run_dir": str(run), "epochs": 3}))
    (run / "metrics.json").write_text("{}")
    assert workflow.unexported_run(config) is None


def test_without_tensorflow_the_run_trains_on_jax_and_says_how_to_export_later(small_npz, tmp_path,
                                                                                jax_without_tensorflow):
    # Training runs on every backend, and without TensorFlow or TensorBoard installed (the GPU machine
    # has no TensorFlow); a SavedModel needs TensorFlow's.
    import subprocess
    import sys

    command = [sys.executable, "-m", "keras_attnconv.cli", "train", "--model", "quadratic_tiny", "--model-overrides",
               "{num_layers = 1, hidden_dim = 8, intermediate_dim = 8}", "--dataset", small_npz, "--epochs", "1",
               "--batch-size", "40", "--run-dir", str(tmp_path / "run"), "--export-dir", str(tmp_path / "saved")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=jax_without_tensorflow)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout[result.stdout.index("{\n"):])  # after the epoch lines
    assert summary["optimizer_steps"] == 4 and summary["export"] is None
    assert f"KERAS_BACKEND=tensorflow attnconv export {tmp_path / 'run'} --export-dir" in result.stderr
    assert not (tmp_path / "saved").exists()


def test_export_names_the_backend_it_needs(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(RuntimeError, match="needs the TensorFlow backend; Keras runs on 'jax'"):
        export.export_registered("quadratic_tiny", "unused")
