"""Training callbacks whose files survive a crash: resumable backups, best checkpoint, NaN stop, throughput."""

import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path

import keras
import numpy as np

from keras_attnconv.utils import write_atomically, write_json


def _unsaved_variables(model):
    """The model's variables that ``save_weights`` leaves out: the random streams of its dropout layers.

    Restoring them makes a resumed run draw the same dropout masks as an
    uninterrupted one.
    """
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


class ResumableBackup(keras.callbacks.Callback):
    """Saves the training state after every epoch so that a killed run resumes where it stopped.

    Like `keras.callbacks.BackupAndRestore`, but each state (model weights,
    optimizer variables, the dropout layers' random streams and the epoch) is written to a fresh directory and only then
    published by atomically replacing ``latest.json``: a kill at any moment
    leaves the previous complete state in place, never a half-written or
    mismatched one. Call `restore` before ``fit`` and pass the epoch it returns
    as ``initial_epoch``.

    Args:
        backup_dir: directory of the states.
        keep: number of states kept.
    """

    def __init__(self, backup_dir, keep=2):
        super().__init__()
        self.backup_dir = Path(backup_dir)
        self.keep = keep

    @property
    def _pointer(self):
        return self.backup_dir / "latest.json"

    def restore(self, model, backup_dir=None):
        """Loads the latest complete state into `model`; returns its epoch (0 if none).

        `backup_dir` reads another directory's states (a non-chief worker
        resumes from the chief's backups but writes its own elsewhere).
        """
        backup_dir = Path(backup_dir or self.backup_dir)
        pointer = backup_dir / "latest.json"
        if not pointer.exists():
            return 0
        latest = json.loads(pointer.read_text())
        state = backup_dir / latest["directory"]
        optimizer = model.optimizer
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        model.load_weights(state / "model.weights.h5")
        with np.load(state / "optimizer.npz") as saved:
            values = [saved[f"v{i}"] for i in range(len(saved.files))]
        if len(values) != len(optimizer.variables):
            raise ValueError(f"The backup in {state} has {len(values)} optimizer variables but the optimizer has "
                             f"{len(optimizer.variables)}: it belongs to a different configuration.")
        for variable, value in zip(optimizer.variables, values):
            variable.assign(value)
        streams = state / "random_streams.npz"
        if streams.exists():  # backups of earlier versions have none: dropout then draws anew
            with np.load(streams) as saved:
                for i, variable in enumerate(_unsaved_variables(model)):
                    variable.assign(saved[f"v{i}"])
        return int(latest["epoch"])

    def on_epoch_end(self, epoch, logs=None):
        directory = f"epoch-{epoch + 1:05d}"
        state = self.backup_dir / directory
        partial = self.backup_dir / f".{directory}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        self.model.save_weights(partial / "model.weights.h5")
        arrays = {f"v{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(self.model.optimizer.variables)}
        np.savez(partial / "optimizer.npz", **arrays)
        streams = {f"v{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(_unsaved_variables(self.model))}
        np.savez(partial / "random_streams.npz", **streams)
        shutil.rmtree(state, ignore_errors=True)
        os.replace(partial, state)
        write_json(self._pointer, {"epoch": epoch + 1, "directory": directory})
        states = sorted(p for p in self.backup_dir.glob("epoch-*") if p.is_dir())
        for old in states[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Stops ``fit`` with `NonFiniteLossError` at the end of an epoch whose training loss is NaN or infinite.

    Keras' `TerminateOnNaN` only sets ``stop_training``, so the epoch's end
    callbacks still run and would back up the broken weights; raising here,
    before them, leaves the last backup and the best checkpoint as they were.
    Put it before any callback that writes. The epoch's loss is the mean over
    its batches, so one non-finite batch is enough; checking once per epoch
    keeps the steps asynchronous (a check per batch waits for every step).
    """

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise NonFiniteLossError(
                f"The training loss became {float(loss)} during epoch {epoch + 1}; training stopped. The last "
                "backup and the best checkpoint are kept. Lower the learning rate (e.g. --learning-rate) or check "
                "the data, then rerun the same command to resume from the backup.")


class BestCheckpoint(keras.callbacks.Callback):
    """Saves the model (``.keras``) whenever `monitor` improves, atomically.

    The best value so far is kept in ``<filepath>.json`` beside the model, so
    a resumed run keeps comparing against it.
    """

    def __init__(self, filepath, monitor="val_accuracy", mode="max"):
        super().__init__()
        self.filepath = Path(filepath)
        self.monitor = monitor
        self.better = (lambda a, b: a > b) if mode == "max" else (lambda a, b: a < b)
        self.record = self.filepath.with_suffix(".json")

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None:
            return
        best = json.loads(self.record.read_text())[self.monitor] if self.record.exists() else None
        if best is None or self.better(float(value), best):
            write_atomically(self.filepath, lambda tmp: self.model.save(tmp))
            write_json(self.record, {self.monitor: float(value), "epoch": epoch + 1})


class Throughput(keras.callbacks.Callback):
    """Measures training images per second per epoch (the first epoch includes compilation)."""

    def __init__(self, images_per_epoch):
        super().__init__()
        self.images_per_epoch = images_per_epoch
        self.epoch_seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_seconds.append(time.perf_counter() - self._start)

    @property
    def images_per_second(self):
        """Median over epochs after the first (compilation) when there are any."""
        seconds = self.epoch_seconds[1:] or self.epoch_seconds
        return self.images_per_epoch / statistics.median(seconds) if seconds else None
