"""Training callbacks whose files survive a crash: resumable backups, best checkpoint, NaN stop, the stop of a run
that learned nothing (and its rule, `at_chance`, which the export applies too); the learning rate in each epoch's
logs; the averaged weights for validation and the best checkpoint."""

import json
import math
import numbers
import os
import shutil
import zipfile
from pathlib import Path

import keras
import numpy as np

from keras_attnconv.analysis.charts import accuracy_standard_error
from keras_attnconv.training import global_generators
from keras_attnconv.utils.files import check_free_space, write_atomically, write_json


def _unsaved_variables(model):
    """The model's variables that ``save_weights`` leaves out: the random streams of its dropout layers.

    Restoring them makes a resumed run draw the same dropout masks as an
    uninterrupted one.
    """
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def _save_arrays(path, variables):
    # NumPy's zip writer, not HDF5: on a full disk h5py raises and then crashes the process (exit 139).
    np.savez(path, **{f"v{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(variables)})


def _load_arrays(path, variables, what, state):
    with np.load(path) as saved:
        values = [saved[f"v{i}"] for i in range(len(saved.files))]
    if [tuple(v.shape) for v in values] != [tuple(v.shape) for v in variables]:
        raise ValueError(
            f"The backup in {state} has {len(values)} {what} that do not match the "
            f"{len(variables)} of this run: it belongs to a different configuration."
        )
    for variable, value in zip(variables, values):
        variable.assign(value)


class ResumableBackup(keras.callbacks.Callback):
    """Saves the training state after every epoch so that a killed run resumes where it stopped.

    Like `keras.callbacks.BackupAndRestore`, but each state (model weights,
    optimizer variables, the dropout layers' random streams, PyTorch's global
    generators on that backend, and the epoch) is
    written to a fresh directory and only then published by atomically
    replacing ``latest.json``: a kill at any moment leaves the previous
    complete state in place, never a half-written or mismatched one. Put it
    after every other callback that writes at the end of an epoch: the
    published epoch is then one whose every record is written, and a resumed
    run rewinds the records of a later, unpublished epoch (`rewind_csv`,
    ``AttentionCentersHistory(initial_epoch=...)``). Call `restore` before
    ``fit``, pass the epoch it returns as ``initial_epoch`` and this callback
    to that ``fit`` (it sets PyTorch's generators when training begins).

    Before writing, the free space is checked against the state's size: a
    full disk is an error naming the directory, the previous state kept.

    Args:
        backup_dir: directory of the states.
        keep: number of states kept.
    """

    def __init__(self, backup_dir, keep=2):
        super().__init__()
        self.backup_dir = Path(backup_dir)
        self.keep = keep
        self._saved_generators = {}  # the global generators' states `restore` read, set when training begins

    @property
    def _pointer(self):
        return self.backup_dir / "latest.json"

    def restore(self, model, backup_dir=None):
        """Loads the latest complete state into `model`; returns its epoch (0 if none).

        `backup_dir` reads another directory's states (a non-chief worker
        resumes from the chief's backups but writes its own elsewhere). A
        damaged backup is an error naming it (backups are written whole, so
        only something else can damage one).
        """
        backup_dir = Path(backup_dir or self.backup_dir)
        if not (backup_dir / "latest.json").exists():
            return 0
        try:
            return self._restore(model, backup_dir)
        except (OSError, KeyError, EOFError, zipfile.BadZipFile, json.JSONDecodeError) as error:
            raise ValueError(
                f"The backup in {backup_dir} cannot be read ({type(error).__name__}: {error}). Move it "
                f"away to train from the start. Received: backup_dir={str(backup_dir)!r}"
            ) from None

    def _restore(self, model, backup_dir):
        latest = json.loads((backup_dir / "latest.json").read_text())
        state = backup_dir / latest["directory"]
        optimizer = model.optimizer
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        if (state / "model.npz").exists():
            _load_arrays(state / "model.npz", model.weights, "weights", state)
        else:  # backups of earlier versions
            model.load_weights(state / "model.weights.h5")
        _load_arrays(state / "optimizer.npz", optimizer.variables, "optimizer variables", state)
        streams = state / "random_streams.npz"
        if streams.exists():  # backups of earlier versions have none: dropout then draws anew
            _load_arrays(streams, _unsaved_variables(model), "random streams", state)
        self._saved_generators = global_generators.read_states(state / "generators.npz")
        return int(latest["epoch"])

    def on_train_begin(self, logs=None):
        # Set here, not in `restore`: on PyTorch, `fit` draws from the global generator before it trains (its
        # symbolic build of the step), as the uninterrupted run did before its first epoch.
        global_generators.set_states(self._saved_generators)
        self._saved_generators = {}

    def on_epoch_end(self, epoch, logs=None):
        directory = f"epoch-{epoch + 1:05d}"
        state = self.backup_dir / directory
        partial = self.backup_dir / f".{directory}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        groups = {
            "model.npz": self.model.weights,
            "optimizer.npz": self.model.optimizer.variables,
            "random_streams.npz": _unsaved_variables(self.model),
        }
        generators = global_generators.states()
        check_free_space(
            self.backup_dir,
            sum(_nbytes(v) for group in groups.values() for v in group) + sum(a.nbytes for a in generators.values()),
            f"the backup of epoch {epoch + 1}",
        )
        partial.mkdir(parents=True)
        for name, variables in groups.items():
            _save_arrays(partial / name, variables)
        if generators:
            np.savez(partial / "generators.npz", **generators)
        shutil.rmtree(state, ignore_errors=True)
        os.replace(partial, state)
        write_json(self._pointer, {"epoch": epoch + 1, "directory": directory})
        states = sorted(p for p in self.backup_dir.glob("epoch-*") if p.is_dir())
        for old in states[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)


def _nbytes(variable):
    return int(np.prod(variable.shape)) * np.dtype(keras.backend.standardize_dtype(variable.dtype)).itemsize


def rewind_csv(path, initial_epoch):
    """Keeps the header and the rows of epochs before `initial_epoch` of a CSVLogger file (none: removed).

    A run killed after an epoch's row was written but before its backup was
    published redoes that epoch: its row must not be there twice.
    """
    path = Path(path)
    if not path.exists():
        return
    if initial_epoch == 0:
        path.unlink()
        return
    # Bytes, not text: reading text turns the CSV writer's "\r\n" line ends into "\n", and the kept rows would end
    # otherwise than those the resumed run appends (and than an uninterrupted run's file).
    header, *rows = path.read_bytes().splitlines(keepends=True)
    kept = [row for row in rows if row.strip() and int(row.split(b",", 1)[0]) < initial_epoch]
    write_atomically(path, lambda tmp: tmp.write_bytes(b"".join([header, *kept])))


def csv_history(path):
    """The columns of a CSVLogger file as ``{name: [float per epoch]}`` (without the epoch column)."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()] if Path(path).exists() else []
    if not lines:
        return {}
    names = lines[0].split(",")
    rows = [[float(value) for value in line.split(",")] for line in lines[1:]]
    return {name: [row[index] for row in rows] for index, name in enumerate(names) if name != "epoch"}


def csv_columns(path):
    """The header of a CSVLogger file (its column names), [] if it is absent or empty."""
    path = Path(path)
    first = path.read_text().split("\n", 1)[0].strip() if path.exists() else ""
    return first.split(",") if first else []


class LearningRateLog(keras.callbacks.Callback):
    """Adds the optimizer's learning rate at the end of each epoch to the epoch's logs (``learning_rate``).

    Put it before the callbacks that record the logs (CSVLogger): the training
    curves draw the schedule from ``history.csv``. Keras' own TensorBoard
    callback adds it only after the others have read the logs.
    """

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)  # loss scaling
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(optimizer.learning_rate))


class NonFiniteLossError(FloatingPointError):
    """The training or validation loss (or another metric of the epoch) became NaN or infinite."""


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Stops ``fit`` with `NonFiniteLossError` at the end of an epoch with a NaN or infinite loss or metric.

    The validation figures are checked like the training loss: a model whose
    outputs overflow on the validation data (e.g. in float16) keeps a chance
    accuracy, which would otherwise be kept as best, preset and exported.
    Keras' `TerminateOnNaN` only sets ``stop_training``, so the epoch's end
    callbacks still run and would back up the broken weights; raising here,
    before them, leaves the last backup and the best checkpoint as they were.
    Put it before any callback that writes. The epoch's loss is the mean over
    its batches, so one non-finite batch is enough; checking once per epoch
    keeps the steps asynchronous (a check per batch waits for every step).
    """

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        for name in sorted(logs, key=lambda name: name != "loss"):  # the training loss first
            value = float(logs[name])
            if not math.isfinite(value):
                what = {"loss": "training loss", "val_loss": "validation loss"}.get(name, f"metric {name!r}")
                # Resuming this run reruns its diverging settings, and a run with a completed epoch is never
                # resumed with others: the remedy is a new run directory.
                raise NonFiniteLossError(
                    f"The {what} became {value} during epoch {epoch + 1}; training stopped. The last backup and "
                    "the best checkpoint are kept. Train again with a lower --learning-rate (or check the data) "
                    f"in a new --run-dir: this run resumes only with its own settings. Received: {name}={value}"
                )


#: A finite training loss above this many times ln(classes), the cross-entropy of a model at chance, has exploded.
EXPLODED_LOSS_FACTOR = 10


def chance_interval(classes, examples):
    """The accuracies of a model at chance on `examples` images of `classes` classes: 1/k ± 2 standard errors.

    Returns:
        ``(low, high)`` = ``1/k -+ 2 sqrt((1/k) (1 - 1/k) / n)``, or None where the `examples` cannot tell
        chance apart from a model that learned something: where 2 s.e. exceeds ``1/(2k)`` (the interval would
        reach 1.5 times chance), i.e. below ``16 (k - 1)`` images (144 for 10 classes, 1,584 for 100).
    """
    if classes < 2 or examples < 16 * (classes - 1):
        return None
    chance = 1.0 / classes
    half_width = 2.0 * accuracy_standard_error(chance, examples)
    return chance - half_width, chance + half_width


def at_chance(accuracy, classes, examples):
    """The `chance_interval` if `accuracy` on `examples` images of `classes` classes lies in it, else None.

    The one rule of "learned nothing", for the run's stop (`StopWhenNothingLearned`) and for the export of a
    finished run or preset. None also where the images are too few to tell (`chance_interval`).
    """
    interval = chance_interval(classes, examples)
    if interval is None or not math.isfinite(accuracy):
        return None
    return interval if interval[0] <= accuracy <= interval[1] else None


def describe_chance(accuracy, classes, examples):
    """``accuracy 0.1000 on 500 images is at chance, 1/10 ± 2 s.e. = [0.0732, 0.1268]`` (for messages)."""
    low, high = chance_interval(classes, examples)
    return f"accuracy {accuracy:.4f} on {examples} images is at chance, 1/{classes} ± 2 s.e. = [{low:.4f}, {high:.4f}]"


def exploded_loss_threshold(classes):
    """The training loss above which a finite loss has exploded: `EXPLODED_LOSS_FACTOR` x ln(classes)."""
    return EXPLODED_LOSS_FACTOR * math.log(classes)


def first_epoch_after_warmup(warmup_steps, steps_per_epoch):
    """The index of the first epoch whose end is past the warm-up's last step: ``warmup_steps // steps_per_epoch``.

    The warm-up is steps ``0 .. warmup_steps - 1``; epoch ``e`` ends after step ``(e + 1) * steps_per_epoch - 1``.
    No warm-up: 0, the first epoch. The paper's 300 epochs of 500 steps (official schedule: a warm-up of
    7,515 steps): epoch index 15, the 16th epoch.
    """
    return warmup_steps // steps_per_epoch


def first_trained_epoch(schedule, steps_per_epoch):
    """The index of the first epoch with a step at a learning rate above 0 (`schedule.first_nonzero_step`).

    The epochs before it leave the model's initial weights as they are (the
    official schedule's first epoch, at rate 0): what they score is the
    initialisation's, not something learned, so none of them is ever the best
    checkpoint (`BestCheckpoint`) or judged by `StopWhenNothingLearned`.
    """
    return schedule.first_nonzero_step // steps_per_epoch


def first_judged_epoch(schedule, steps_per_epoch):
    """The first epoch `StopWhenNothingLearned` judges: past the warm-up, and trained (`first_trained_epoch`).

    A warm-up shorter than an epoch under the official schedule ends within
    the first epoch, which still trained at rate 0: the second is judged.
    """
    return max(
        first_epoch_after_warmup(schedule.warmup_steps, steps_per_epoch),
        first_trained_epoch(schedule, steps_per_epoch),
    )


# Fewer optimizer steps than this in all, and a run at chance may only be too short to learn (a smoke test's
# `--steps-per-epoch 3`): the error says so beside the usual advice, which blames the rate.
FEW_STEPS = 100


class NothingLearnedError(RuntimeError):
    """After its warm-up, the model is at chance on the validation images, or its training loss exploded."""


class StopWhenNothingLearned(keras.callbacks.Callback):
    """Stops ``fit`` with `NothingLearnedError` at the end of an epoch after the warm-up where nothing was learned.

    From the epoch `first_epoch` on (`first_judged_epoch`: the first whose
    end is past the warm-up, and that trained), each epoch's end checks, in this order:

    - the training loss (finite: NaN and infinities are `StopOnNonFiniteLoss`'s)
      above ``EXPLODED_LOSS_FACTOR x ln(num_classes)`` (23.0 for 10 classes):
      a model at chance has ``ln(num_classes)``, so such a loss exploded;
    - the validation accuracy at chance (`at_chance`): within two standard
      errors of ``1/num_classes`` on the `eval_examples` images, where they are
      enough to tell (`chance_interval`: at least ``16 (num_classes - 1)``).

    Like `StopOnNonFiniteLoss`, it raises before the epoch's end callbacks
    that write: put it before them (after the NaN stop). The epoch that failed
    is then neither a backup nor the best checkpoint; the earlier epochs'
    records stay. The run never finishes, so it has no preset and is not exported.

    Args:
        num_classes: int >= 2, the classes of the model's output.
        eval_examples: int, the validation images each epoch's accuracy is measured on.
        first_epoch: int >= 0, the index of the first epoch checked.
    """

    def __init__(self, num_classes, eval_examples, first_epoch=0):
        super().__init__()
        for name, value, least in (
            ("num_classes", num_classes, 2),
            ("eval_examples", eval_examples, 0),
            ("first_epoch", first_epoch, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise ValueError(f"`{name}` must be an integer >= {least}. Received: {name}={value!r}")
        self.num_classes = int(num_classes)
        self.eval_examples = int(eval_examples)
        self.first_epoch = int(first_epoch)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if epoch < self.first_epoch:  # still warming up (or just done): the rate has not reached its peak
            return
        loss, threshold = float(logs.get("loss", math.nan)), exploded_loss_threshold(self.num_classes)
        accuracy = float(logs.get("val_accuracy", math.nan))
        exploded = math.isfinite(loss) and loss > threshold
        if not exploded and not at_chance(accuracy, self.num_classes, self.eval_examples):
            return
        steps = self._steps_trained()
        when = f"in epoch {epoch + 1}, after the warm-up"
        when += "" if steps is None else f" and {steps} training steps in all"
        advice = (
            "The records of the earlier epochs are kept and nothing is exported. Train again in a new "
            "--run-dir with a longer warm-up (--warmup-ratio) or a lower --learning-rate."
        )
        if exploded:
            raise NothingLearnedError(
                f"The training loss exploded to {loss:.4g} {when} (above "
                f"{EXPLODED_LOSS_FACTOR} ln {self.num_classes} = {threshold:.4g}; a model at chance has "
                f"ln {self.num_classes} = {math.log(self.num_classes):.4g}); training stopped. {advice} "
                f"Received: loss={loss:.6g}"
            )
        if steps is not None and steps < FEW_STEPS:
            advice += f" {steps} steps may also be too few to learn anything: train more (--epochs, --steps-per-epoch)."
        raise NothingLearnedError(
            f"The model learned nothing: {when}, its validation "
            f"{describe_chance(accuracy, self.num_classes, self.eval_examples)}; training stopped. {advice} "
            f"Received: val_accuracy={accuracy:.6g}"
        )

    def _steps_trained(self):
        """The optimizer's steps so far (a resumed run's earlier ones included); None for a callback on no model."""
        optimizer = None if self._model is None else getattr(self.model, "optimizer", None)
        return None if optimizer is None else optimizer_steps(optimizer)


def optimizer_steps(optimizer):
    """The steps `optimizer` has taken, as an int: a resumed run's restored ones included."""
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


class BestCheckpoint(keras.callbacks.Callback):
    """Saves the model (``.keras``) whenever `monitor` improves, atomically.

    The best value so far is kept in ``<filepath>.json`` beside the model, so
    a resumed run keeps comparing against it. The epochs before `first_epoch`
    (`first_trained_epoch`) are never saved: their weights are the initial
    ones, and an initialisation that happens to score above the trained epochs
    would otherwise be published as the run's trained model.
    """

    def __init__(self, filepath, monitor="val_accuracy", mode="max", first_epoch=0):
        super().__init__()
        self.filepath = Path(filepath)
        self.monitor = monitor
        self.better = (lambda a, b: a > b) if mode == "max" else (lambda a, b: a < b)
        self.record = self.filepath.with_suffix(".json")
        self.first_epoch = first_epoch

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None or epoch < self.first_epoch:
            return
        best = json.loads(self.record.read_text())[self.monitor] if self.record.exists() else None
        if best is None or self.better(float(value), best):
            write_atomically(self.filepath, lambda tmp: self.model.save(tmp))
            write_json(self.record, {self.monitor: float(value), "epoch": epoch + 1})


class WithAveragedWeights(keras.callbacks.SwapEMAWeights):
    """Validation, and the epoch end of `callbacks`, on the optimizer's averaged weights (Keras' ``use_ema``).

    `keras.callbacks.SwapEMAWeights` swaps the averages into the model for
    validation; its ``swap_on_epoch=True`` would leave them in for every
    callback after it, the backup too, which would then save the averages as
    the trained weights and a resumed run would train on from them. Here the
    averages are in the model only while `callbacks` (e.g. `BestCheckpoint`)
    handle the epoch's end, and swapped back before the next callback. Give
    it callbacks that act at an epoch's end only.
    """

    def __init__(self, *callbacks):
        super().__init__(swap_on_epoch=False)
        self.callbacks = callbacks

    def set_model(self, model):
        super().set_model(model)
        for callback in self.callbacks:
            callback.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        for callback in self.callbacks:
            callback.set_params(params)

    def on_epoch_end(self, epoch, logs=None):
        self._swap_variables()
        try:
            for callback in self.callbacks:
                callback.on_epoch_end(epoch, logs)
        finally:
            self._swap_variables()
