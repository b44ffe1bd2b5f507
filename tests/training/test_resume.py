"""A run SIGKILLed at any moment of an epoch's end, then run again, leaves the run an uninterrupted one leaves:
the same history.csv, metrics.json history, best checkpoint and centers history."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_attnconv.training.fit import train
from keras_attnconv.training.recipe import TrainConfig

#: Where the killed process dies, at the end of its second epoch: after each epoch-end step that writes.
KILLS = {
    "after the best checkpoint": "kill_after(callbacks.BestCheckpoint, 'on_epoch_end')",
    "after the history.csv row": "kill_after(keras.callbacks.CSVLogger, 'on_epoch_end')",
    "after the centers": "kill_after(analysis.AttentionCentersHistory, 'on_epoch_end')",
    "inside the backup, its state written but not published": "kill_before_publishing()",
    "after the backup": "kill_after(callbacks.ResumableBackup, 'on_epoch_end')",
}
KILLER = """
import os, signal, sys
import keras
from keras_attnconv import analysis
from keras_attnconv.training import callbacks
from keras_attnconv.training import TrainConfig, train

EPOCH = 1  # the second epoch

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def kill_after(cls, name):
    real = getattr(cls, name)
    def wrapped(self, epoch, logs=None):
        real(self, epoch, logs)
        if epoch == EPOCH:
            die()
    setattr(cls, name, wrapped)

def kill_before_publishing():
    real = callbacks.write_json
    def wrapped(path, data):
        if path.name == "latest.json" and data["epoch"] == EPOCH + 1:
            die()
        real(path, data)
    callbacks.write_json = wrapped

{kill}
train(TrainConfig(**{config!r}))
"""


def config(small_npz, run_dir):
    # A quadratic model records centers; dropout makes the resumed random streams matter.
    return {
        "name": "small",
        "model": "quadratic_tiny",
        "model_overrides": {"num_layers": 1, "hidden_dim": 16, "intermediate_dim": 16, "dropout": 0.3},
        "dataset": small_npz,
        "epochs": 3,
        "steps_per_epoch": 3,
        "batch_size": 20,
        "run_dir": str(run_dir),
        "verbose": 0,
        "jit_compile": False,
        "export_dir": None,
    }


@pytest.fixture(scope="module")
def uninterrupted(small_npz, tmp_path_factory):
    run = tmp_path_factory.mktemp("whole") / "run"
    train(TrainConfig(**config(small_npz, run)))
    return run


def tensorboard_scalars(run):
    """Every scalar of the run's TensorBoard logs as TensorBoard reads them: {writer/tag: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    scalars = {}
    for writer in ("train", "validation"):
        events = EventAccumulator(str(run / "logs" / writer), size_guidance={"tensors": 0})  # 0: every event
        events.Reload()
        for tag in events.Tags()["tensors"]:
            scalars[f"{writer}/{tag}"] = [(e.step, float(make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
    return scalars


def record(run):
    """What a finished run leaves that must not depend on a kill."""
    metrics = json.loads((run / "metrics.json").read_text())
    best = keras.saving.load_model(run / "checkpoints" / "best.keras", compile=False)
    with np.load(run / "centers_history.npz") as centers:
        centers = {name: centers[name] for name in centers.files}
    preset_metrics = json.loads((run / "preset" / "metadata.json").read_text())["metrics"]
    return {
        "history.csv": (run / "history.csv").read_bytes(),  # to the byte: Keras' CSVLogger ends its rows in \r\n
        "history": metrics["history"],
        "steps": metrics["optimizer_steps"],
        "best.json": json.loads((run / "checkpoints" / "best.json").read_text()),
        "best weights": best.get_weights(),
        "centers": centers,
        "preset metrics": preset_metrics,
        # An epoch redone after the kill is drawn once, as in the uninterrupted run.
        "tensorboard": tensorboard_scalars(run),
    }


@pytest.mark.parametrize("kill", KILLS)
def test_a_kill_at_the_end_of_an_epoch_loses_nothing(kill, small_npz, uninterrupted, tmp_path):
    run = tmp_path / "run"
    script = textwrap.dedent(KILLER).format(kill=KILLS[kill], config=config(small_npz, run))
    killed = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (run / "metrics.json").exists()
    keras.utils.set_random_seed(999)  # the rerun is another process: nothing global carries over
    train(TrainConfig(**config(small_npz, run)))
    found, expected = record(run), record(uninterrupted)
    assert expected["tensorboard"]["validation/epoch_accuracy"]  # the logs were read
    for key in ("history.csv", "history", "steps", "best.json", "preset metrics", "tensorboard"):
        assert found[key] == expected[key], key
    for a, b in zip(found["best weights"], expected["best weights"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert found["centers"].keys() == expected["centers"].keys()
    for name in expected["centers"]:
        np.testing.assert_array_equal(found["centers"][name], expected["centers"][name])


FILL_THE_DISK = """
import os, sys
from keras_attnconv import cli
from keras_attnconv.training import callbacks

real = callbacks.ResumableBackup.on_epoch_end

def fill_after_the_first_epoch(self, epoch, logs=None):
    real(self, epoch, logs)
    if epoch == 0:  # another process takes every free byte
        with open({filler!r}, "wb") as filler:
            try:
                while True:
                    filler.write(bytes(2**16))
                    filler.flush()
            except OSError:
                pass

callbacks.ResumableBackup.on_epoch_end = fill_after_the_first_epoch
sys.exit(cli.main({args!r}))
"""


def test_a_full_disk_stops_the_run_with_an_error_and_it_resumes_once_there_is_room(
    small_npz, uninterrupted, small_disk
):
    run = small_disk / "run"
    values = config(small_npz, run)
    args = [
        "train",
        "--name",
        values["name"],
        "--model",
        values["model"],
        "--model-overrides",
        "{num_layers = 1, hidden_dim = 16, intermediate_dim = 16, dropout = 0.3}",
        "--dataset",
        small_npz,
        "--epochs",
        "3",
        "--steps-per-epoch",
        "3",
        "--batch-size",
        "20",
        "--run-dir",
        str(run),
        "--verbose",
        "0",
        "--jit-compile",
        "false",
        "--export-dir",
        "none",
    ]
    script = textwrap.dedent(FILL_THE_DISK).format(filler=str(small_disk / "filler"), args=args)
    full = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert full.returncode == 2, full.stderr[-2000:]  # an error, not a crash of HDF5 (exit 139)
    message = full.stderr.strip().splitlines()[-1]  # (TensorFlow's start-up lines come before: imported early here)
    assert message.startswith("attnconv train: error: [Errno 28] No space left") and f"run_dir='{run}'" in message
    assert json.loads((run / "backup" / "latest.json").read_text())["epoch"] == 1
    (small_disk / "filler").unlink()
    keras.utils.set_random_seed(999)
    train(TrainConfig(**values))
    found, expected = record(run), record(uninterrupted)
    for key in ("history.csv", "history", "steps", "best.json"):
        assert found[key] == expected[key], key
