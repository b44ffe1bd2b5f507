"""The training pipeline behind `attnconv train`: recipe -> run directory -> trained model + metrics.

The run directory (its layout, mark, lock and states: `run_directory.RunDirectory`)
receives the resolved recipe, resumable backups, the best checkpoint, logs and
history, and once finished the best checkpoint as a preset (with the recipe and
the metrics of those weights) and ``metrics.json``. Running the same command
again after a crash resumes the run with the same per-epoch results as an uninterrupted run (the
data order, augmentation and dropout streams are restored with the weights);
running it after the run finished starts a new directory (``<name>-1``, ...).

Everything (recipe, model configuration, data, schedule, strategy) is checked
before the run directory is created, so a typo never leaves a half-made run
behind; a lock keeps a second process out of a run directory in use. Export
for serving is a separate step (`keras_attnconv.export`), which
`attnconv train` runs after training.
"""

import contextlib
import dataclasses
import errno
import itertools
import json
import sys
import tempfile
import time

import keras

from keras_attnconv.analysis import AttentionCentersHistory, layer_centers
from keras_attnconv.callbacks import (
    BestCheckpoint,
    ResumableBackup,
    StopOnNonFiniteLoss,
    Throughput,
    csv_history,
    rewind_csv,
)
from keras_attnconv.precision import PRECISIONS
from keras_attnconv.recipe import STRATEGIES, TrainConfig, load_recipe, toml_module
from keras_attnconv.run_directory import RunDirectory, RunInUseError

__all__ = ["PRECISIONS", "STRATEGIES", "RunInUseError", "TrainConfig", "load_recipe", "resolve_run_dir",
           "toml_module", "train"]


def make_strategy(name):
    """The tf.distribute strategy: one device, all local GPUs (or CPUs), or all workers of TF_CONFIG.

    On other backends only ``"default"`` exists (None: no strategy scope).
    """
    if keras.backend.backend() != "tensorflow":
        if name != "default":
            raise ValueError(f"`strategy` {name!r} needs the TensorFlow backend (tf.distribute); the backend is "
                             f"{keras.backend.backend()!r}. Received: strategy={name!r}")
        return None
    import tensorflow as tf

    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def is_chief(strategy):
    """Whether this process writes the run directory: yes, except on the other workers of a TF_CONFIG cluster.

    tf.distribute's own rule (``should_checkpoint``): the task of type "chief",
    or worker 0 in a cluster without one; always true for one-machine strategies.
    """
    return strategy is None or strategy.extended.should_checkpoint


def resolve_run_dir(config):
    """The `RunDirectory` of `config`: the configured one, or the first numbered one that is free or unfinished.

    Numbered directories that hold a finished run, or something that is not a
    run of the package, are passed over (never written).
    """
    if config.run_dir:
        return RunDirectory(config.run_dir)
    return next(run for run in RunDirectory.numbered(config.runs_dir, config.name)
                if run.is_free() or (run.is_ours() and not run.metrics_file.exists()))


def finished_run(config):
    """The latest finished `RunDirectory` of `config` with the same settings (`same_run`), or None."""
    if config.run_dir:
        candidates = [RunDirectory(config.run_dir)]
    else:
        candidates = itertools.takewhile(lambda run: not run.is_free(),
                                         RunDirectory.numbered(config.runs_dir, config.name))
    finished = None
    for candidate in candidates:
        if candidate.is_finished():
            finished = candidate
        elif candidate.is_ours():  # the unfinished run: the numbers after it are not made yet
            break
    if finished is None:
        return None
    return None if same_run(finished.read_config() or {}, resolved_config(config, finished)) else finished


def resolved_config(config, run):
    """The dict written to ``config.json``: the config with its run directory."""
    return {**dataclasses.asdict(config), "run_dir": str(run)}


def same_run(saved, resolved):
    """The fields (other than verbosity, place and export) in which two resolved configs differ."""
    ignored = ("verbose", "run_dir", "export_dir")
    return sorted(k for k in set(saved) | set(resolved) if k not in ignored and saved.get(k) != resolved.get(k))


def _check_same_run(run, resolved):
    """Whether `run` holds a run of another configuration that never completed an epoch (to start anew).

    Raises for a directory that is not a run of the package or a finished run,
    which are never touched, and for an unfinished run of another
    configuration with a completed epoch, which is never lost.
    """
    run.check()
    if run.metrics_file.exists():
        raise FileExistsError(f"{run} holds a finished run, which is never overwritten: pass another --run-dir, or "
                              f"none for the next free one under runs_dir. Received: run_dir={str(run)!r}")
    saved = run.read_config()
    changed = same_run(saved, resolved) if saved is not None else []
    if changed and run.has_completed_epoch():
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {resolved.get(k)!r}" for k in changed)
        raise ValueError(f"{run} holds an unfinished run with a different configuration ({details}) and a "
                         "completed epoch. Resume it with the same settings, or pass another --run-dir.")
    return bool(changed)


@dataclasses.dataclass
class _Plan:
    """What a run needs, computed and checked before anything is written."""

    dataset: object  # DatasetInfo
    model_fields: dict
    eval_split: str
    train_batches: object
    eval_batches: object
    steps_per_epoch: int
    schedule: object
    strategy: object
    replicas: int


def _model_fields(config, info):
    """The model's configuration fields for `config` on a dataset (`DatasetInfo`), checked; loads no data."""
    from keras_attnconv.data import pixel_statistics
    from keras_attnconv.models import get_model_config

    from_dataset = {"num_classes": info.num_classes, "image_size": info.image_size}
    for field, value in from_dataset.items():
        if field in config.model_overrides and config.model_overrides[field] != value:
            raise ValueError(f"`{field}` comes from the dataset ({value} for {config.dataset}) and cannot be "
                             f"overridden. Received: model_overrides={config.model_overrides!r}")
    mean, std = pixel_statistics(info, config.normalization)
    model_fields = {**from_dataset, "class_names": info.class_names, "pixel_mean": mean, "pixel_std": std,
                    **config.model_overrides}
    get_model_config(config.model, **model_fields)
    return model_fields


def _plan(config):
    """Checks the dataset, model configuration, schedule and strategy of `config`; writes nothing."""
    from keras_attnconv.data import dataset_info, load_arrays
    from keras_attnconv.input_pipeline import ArrayBatches
    from keras_attnconv.optim import run_schedule

    info = dataset_info(config.dataset)
    model_fields = _model_fields(config, info)
    eval_split = config.eval_split or info.eval_split
    data_args = {"data_dir": config.data_dir, "download": config.download}
    train_batches = ArrayBatches(*load_arrays(config.dataset, "train", **data_args), augment=True, shuffle=True,
                                 seed=config.seed, drop_remainder=True, steps_per_epoch=config.steps_per_epoch,
                                 batch_size=config.batch_size)
    eval_batches = ArrayBatches(*load_arrays(config.dataset, eval_split, **data_args), batch_size=config.batch_size)
    steps_per_epoch = len(train_batches)
    schedule = run_schedule(config.schedule, config.learning_rate, config.epochs, steps_per_epoch,
                            config.warmup_ratio)
    strategy = make_strategy(config.strategy)
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    if config.batch_size % replicas:
        raise ValueError(f"`batch_size` must divide evenly across the {replicas} replicas of the "
                         f"{config.strategy!r} strategy. Received: batch_size={config.batch_size}")
    return _Plan(info, model_fields, eval_split, train_batches, eval_batches, steps_per_epoch, schedule, strategy,
                 replicas)


def _work_around_keras_multi_worker(model, strategy, batch):
    """Works around keras-team/keras#20585 (open; Keras 3 through 3.15): ``fit`` under MultiWorkerMirroredStrategy.

    Keras' TensorFlow trainer fails there twice: (1) before training it builds
    the model from the first distributed batch, which it first averages with
    ``strategy.reduce`` outside a replica context ("Attempt to convert a value
    (PerReplica...)"): build it from one plain NumPy batch instead, which needs
    no reduction; (2) after each step it averages the scalar logs with
    ``strategy.reduce("MEAN", value, axis=0)``, an axis that a scalar lacks:
    reduce scalars without an axis (their mean over the replicas).
    """
    build = model._maybe_symbolic_build
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: build(data_batch=batch)
    reduce = strategy.reduce

    def reduce_scalars_without_axis(reduce_op, value, axis):
        local = strategy.experimental_local_results(value)[0]
        return reduce(reduce_op, value, axis=None if local.shape.rank == 0 else axis)

    strategy.reduce = reduce_scalars_without_axis


def _center_tracking(model, run, initial_epoch):
    """Records the heads' centers each epoch (``centers_history.npz``) for Gaussian-type models."""
    try:
        layer_centers(model)
    except ValueError:  # no quadratic/gaussian attention in this model
        return []
    return [AttentionCentersHistory(run.centers_history, initial_epoch=initial_epoch)]


def _tensorflow_importable():
    """Whether TensorFlow imports (an import, not a lookup: a package that is present but broken counts as absent)."""
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return False
    return True


def _logging_callbacks(run):
    """CSV history always; TensorBoard where TensorFlow (its writer) is installed."""
    callbacks = [keras.callbacks.CSVLogger(str(run.history), append=True)]
    if _tensorflow_importable():
        callbacks.append(keras.callbacks.TensorBoard(str(run.logs_dir), profile_batch=0))
    return callbacks


def check_run(config, *, models=()):
    """Checks everything `train` checks before it writes (dataset, model configuration, schedule, strategy).

    Each name of `models` is checked too, as `config` with that model: the
    data, schedule and strategy, which do not depend on the model, are loaded
    and checked once (a comparison trains several models on the same data).
    """
    plan = _plan(config)
    for name in models:
        _model_fields(dataclasses.replace(config, model=name), plan.dataset)


def train(config):
    """Trains `config` (a `TrainConfig`) and returns the final metrics dict (also in ``metrics.json``).

    Raises ValueError naming the field for a bad dataset, model override,
    schedule or strategy before anything is written; `RunInUseError` when
    another process trains in the same run directory; and
    `keras_attnconv.callbacks.NonFiniteLossError` when the training or
    validation loss becomes NaN or infinite (the last backup and the best
    checkpoint are kept). The
    precision is the model's own (``build_model(..., dtype=config.precision)``):
    Keras' global dtype policy is neither read nor changed.
    """
    plan = _plan(config)
    run = resolve_run_dir(config)
    resolved = resolved_config(config, run)
    _check_same_run(run, resolved)
    if not is_chief(plan.strategy):
        # The other workers run every step and callback (saving may involve collectives) but write
        # into a scratch directory; they resume from the chief's backups (a filesystem all share).
        with tempfile.TemporaryDirectory(prefix="attnconv-worker-") as scratch:
            return {**_fit(config, plan, RunDirectory(scratch), resume_from=run.backup_dir), "run_dir": str(run),
                    "chief": False}
    run.claim()
    with run.lock():
        if _check_same_run(run, resolved):  # again, now that no other process can write it
            run.start_anew()
        run.write_config(resolved)
        try:
            return _fit(config, plan, run)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            raise OSError(errno.ENOSPC, f"No space left on the device of the run directory ({error}): the last "
                                        "complete backup is kept. Free some space and run the same command again "
                                        f"to resume. Received: run_dir={str(run)!r}") from None


def _save_best_as_preset(config, plan, run):
    """Writes the best checkpoint as the run's ``preset/`` with the recipe and the metrics of those exact weights.

    A run killed after its preset was published (and before ``metrics.json``)
    keeps that preset: it holds the same best checkpoint.
    """
    from keras_attnconv.presets import save_to_preset

    if run.preset_dir.exists():
        return run.preset_dir
    try:
        best = keras.saving.load_model(run.best_checkpoint, compile=False)
    except Exception as error:  # Keras reports a damaged archive as "File not found" or a zip error
        raise ValueError(f"{run.best_checkpoint} cannot be loaded ({error}); it was damaged after "
                         f"training wrote it. Received: run_dir={str(run)!r}") from None
    best.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    loss, accuracy = best.evaluate(plan.eval_batches, verbose=0)
    record = json.loads(run.best_record.read_text())
    metrics = {"epoch": record["epoch"], "eval_split": plan.eval_split, "eval_loss": float(loss),
               "eval_accuracy": float(accuracy)}
    metadata = {"weights": f"trained: the best epoch by validation accuracy ({record['epoch']} of {config.epochs})",
                "dataset": config.dataset, "metrics": metrics, "recipe": resolved_config(config, run),
                "training_run": run.path_from_preset()}
    return save_to_preset(best, run.preset_dir, metadata=metadata)


def run_optimizer(config, schedule):
    """The optimizer of a run: `CoupledWeightDecaySGD` with the recipe's momentum, decay and exemptions."""
    from keras_attnconv.layers import CENTER_AND_SPREAD_WEIGHTS
    from keras_attnconv.optim import CoupledWeightDecaySGD

    return CoupledWeightDecaySGD(schedule, momentum=config.momentum, weight_decay=config.weight_decay,
                                 no_decay_names=() if config.decay_centers_and_spreads else CENTER_AND_SPREAD_WEIGHTS)


def _fit(config, plan, run, resume_from=None):
    from keras_attnconv.input_pipeline import EpochSync, as_tf_dataset
    from keras_attnconv.models import build_model
    from keras_attnconv.models.summary import trainable_parameters

    scope = plan.strategy.scope() if plan.strategy is not None else contextlib.nullcontext()
    with scope:
        model = build_model(config.model, seed=config.seed, dtype=config.precision, **plan.model_fields)
        # The model's dtype policy makes `compile` wrap the optimizer in a LossScaleOptimizer for mixed_float16.
        model.compile(
            optimizer=run_optimizer(config, plan.schedule),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=config.jit_compile,
        )
        backup = ResumableBackup(run.backup_dir)
        initial_epoch = backup.restore(model, resume_from)
    if initial_epoch:
        print(f"Resuming {run} from epoch {initial_epoch}/{config.epochs}", file=sys.stderr)
    # The records of an epoch after the last published one (a kill before its backup) are redone, not kept twice.
    rewind_csv(run.history, initial_epoch)
    throughput = Throughput(plan.steps_per_epoch * config.batch_size, run.epoch_seconds, initial_epoch)
    start = time.perf_counter()
    train_data, eval_data = plan.train_batches, plan.eval_batches
    if plan.strategy is not None:  # TensorFlow: tf.data, which tf.distribute shards over workers
        train_data, eval_data = as_tf_dataset(train_data), as_tf_dataset(eval_data)
        if config.strategy == "multi_worker":
            _work_around_keras_multi_worker(model, plan.strategy, plan.eval_batches[0])
    model.fit(
        train_data,
        validation_data=eval_data,
        epochs=config.epochs,
        initial_epoch=initial_epoch,
        verbose=config.verbose,
        shuffle=False,  # the batches are shuffled by (seed, epoch), reproducibly
        callbacks=[
            EpochSync(plan.train_batches),
            StopOnNonFiniteLoss(),  # before any callback that writes
            BestCheckpoint(run.best_checkpoint),
            *_logging_callbacks(run),
            throughput,
            *_center_tracking(model, run, initial_epoch),
            backup,  # last: an epoch is published as done once every record of it is written
        ],
    )
    loss, accuracy = model.evaluate(eval_data, verbose=0)
    best_path = run.best_record
    preset = _save_best_as_preset(config, plan, run) if best_path.exists() else None
    metrics = {
        "model": config.model,
        "dataset": config.dataset,
        "eval_split": plan.eval_split,
        "eval_loss": float(loss),
        "eval_accuracy": float(accuracy),
        "best_val_accuracy": json.loads(best_path.read_text())["val_accuracy"] if best_path.exists() else None,
        "epochs": config.epochs,
        "optimizer_steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
        "trainable_parameters": trainable_parameters(model),
        "train_images_per_second": throughput.images_per_second,
        "precision": config.precision,
        "jit_compile": config.jit_compile,
        "replicas": plan.replicas,
        "wall_seconds_this_session": time.perf_counter() - start,
        "history": csv_history(run.history),  # every epoch, also those of the processes before a resume
        "preset": preset and str(preset),
    }
    run.write_metrics(metrics)
    metrics["run_dir"] = str(run)
    return metrics
