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

import errno
import json
import sys
import tempfile
import time

import keras
import numpy as np

from keras_attnconv.analysis.attention import AttentionCentersHistory, layer_centers
from keras_attnconv.analysis.throughput import Throughput
from keras_attnconv.training.callbacks import (
    BestCheckpoint,
    LearningRateLog,
    ResumableBackup,
    StopOnNonFiniteLoss,
    StopWhenNothingLearned,
    WithAveragedWeights,
    csv_columns,
    csv_history,
    first_judged_epoch,
    first_trained_epoch,
    optimizer_steps,
    rewind_csv,
)
from keras_attnconv.training.distribution import (
    build_scope,
    is_chief,
    process_shard,
    run_scope,
    uses_tf_data,
    wait_for_every_process,
    work_around_keras_multi_worker,
)
from keras_attnconv.training.event_logs import rewind_event_files
from keras_attnconv.training.fine_tuning import start_from
from keras_attnconv.training.plan import plan_run
from keras_attnconv.training.run_directory import RunDirectory
from keras_attnconv.training.runs import check_same_run, resolve_run_dir, resolved_config
from keras_attnconv.utils.files import is_full_disk


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
    """CSV history (with the learning rate) always; TensorBoard where TensorFlow (its writer) is installed."""
    columns = csv_columns(run.history)
    # A run resumed from a history.csv written without the learning rate keeps its columns: rows must match the header.
    learning_rate = [LearningRateLog()] if not columns or "learning_rate" in columns else []
    callbacks = [*learning_rate, keras.callbacks.CSVLogger(str(run.history), append=True)]
    if _tensorflow_importable():
        callbacks.append(keras.callbacks.TensorBoard(str(run.logs_dir), profile_batch=0))
    return callbacks


def train(config, plan=None):
    """Trains `config` (a `TrainConfig`) and returns the final metrics dict (also in ``metrics.json``).

    `plan` is `plan_run(config)` where the caller has made it already (`attnconv train` checks its
    model against the export root before training); None makes it.

    Raises ValueError naming the field for a bad dataset, model override,
    schedule or strategy before anything is written; `RunInUseError` when
    another process trains in the same run directory; and
    `keras_attnconv.training.callbacks.NonFiniteLossError` when the training or
    validation loss becomes NaN or infinite, and
    `keras_attnconv.training.callbacks.NothingLearnedError` when, after the
    warm-up, the validation accuracy is at chance or the training loss exploded
    (`StopWhenNothingLearned`); either way the last backup and the best
    checkpoint of the earlier epochs are kept, and the run has no preset. The
    precision is the model's own (``build_model(..., dtype=config.precision)``):
    Keras' global dtype policy is neither read nor changed.
    """
    plan = plan or plan_run(config)
    run = resolve_run_dir(config)
    resolved = resolved_config(config, run)
    check_same_run(run, resolved)
    if not is_chief(plan.strategy):
        # The other workers run every step and callback (saving may involve collectives) but write
        # into a scratch directory; they resume from the chief's backups (a filesystem all share), and
        # decide what the chief decides from a copy of its records, taken once the chief has set the run up.
        wait_for_every_process(plan.strategy, "run directory ready")
        with tempfile.TemporaryDirectory(prefix="attnconv-worker-") as scratch:
            run.copy_decisions_to(RunDirectory(scratch))
            return {
                **_fit(config, plan, RunDirectory(scratch), resume_from=run.backup_dir),
                "run_dir": str(run),
                "chief": False,
            }
    run.claim()
    with run.lock():
        if check_same_run(run, resolved):  # again, now that no other process can write it
            run.start_anew()
        run.write_config(resolved)
        wait_for_every_process(plan.strategy, "run directory ready")
        try:
            return _fit(config, plan, run)
        except OSError as error:
            if not is_full_disk(error):
                raise
            raise OSError(
                errno.ENOSPC,
                f"No space left on the device of the run directory ({error}): the last "
                "complete backup is kept. Free some space and run the same command again "
                f"to resume. Received: run_dir={str(run)!r}",
            ) from None


def _final_evaluation(model, eval_data, history, epochs):
    """(loss, accuracy) of the model's final weights on the evaluation data.

    Where this session trained the last epoch, its validation measured these
    very weights (with weight averaging, the averages, which `fit` leaves in
    the model) with the same compiled function: its logs are the result, and
    a second pass over the evaluation data would only repeat it. A session
    that trained no epoch (a run resumed after its last one) evaluates.
    """
    if history.epoch and history.epoch[-1] == epochs - 1:
        return history.history["val_loss"][-1], history.history["val_accuracy"][-1]
    return model.evaluate(eval_data, verbose=0)


def _save_best_as_preset(config, plan, run, model, eval_data, final_evaluation):
    """Writes the best checkpoint as the run's ``preset/`` with the recipe and the metrics of those exact weights.

    A run killed after its preset was published (and before ``metrics.json``)
    keeps that preset: it holds the same best checkpoint. In a run of one
    process the run's `model` evaluates them (and holds them afterwards): its
    evaluation is traced, or compiled, already, where the reloaded model's
    would be again (seconds on a CPU, more under XLA on a GPU). Where the best
    weights are the final ones (the best epoch is the last), their metrics are
    `final_evaluation`'s, the (loss, accuracy) of the model as it is.
    """
    from keras_attnconv.models.presets import save_to_preset

    if run.preset_dir.exists():
        return run.preset_dir
    best = run.load_best_checkpoint()
    if _holds_every_prediction(config, plan):
        best_weights = best.get_weights()
        if _same_arrays(best_weights, model.get_weights()):
            loss, accuracy = final_evaluation
        else:
            model.set_weights(best_weights)
            loss, accuracy = model.evaluate(eval_data, verbose=0)
    else:  # the run's model is distributed over every process, and this one evaluates alone
        best.compile(loss=run_loss(config), metrics=["accuracy"])
        loss, accuracy = best.evaluate(plan.eval_batches, verbose=0)
    record = json.loads(run.best_record.read_text())
    metrics = {
        "epoch": record["epoch"],
        "eval_split": plan.eval_split,
        "eval_loss": float(loss),
        "eval_accuracy": float(accuracy),
        "eval_examples": len(plan.eval_batches.labels),
    }  # the export's check for chance needs it
    tuned = f"fine-tuned from {config.init_from}" if config.init_from is not None else "trained"
    metadata = {
        "weights": f"{tuned}: the best epoch by validation accuracy ({record['epoch']} of {config.epochs})",
        "dataset": config.dataset,
        "metrics": metrics,
        "recipe": resolved_config(config, run),
        "training_run": run.path_from_preset(),
    }
    return save_to_preset(best, run.preset_dir, metadata=metadata)


def _same_arrays(first, second):
    return len(first) == len(second) and all(np.array_equal(a, b) for a, b in zip(first, second))


def run_optimizer(config, schedule):
    """The optimizer of a run: `CoupledWeightDecaySGD` with the recipe's momentum, decay, exemptions and averaging."""
    from keras_attnconv.layers import CENTER_AND_SPREAD_WEIGHTS
    from keras_attnconv.optim import CoupledWeightDecaySGD

    averaging = {"use_ema": True, "ema_momentum": config.ema_momentum} if config.ema_momentum else {}
    return CoupledWeightDecaySGD(
        schedule,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        no_decay_names=() if config.decay_centers_and_spreads else CENTER_AND_SPREAD_WEIGHTS,
        **averaging,
    )


def run_loss(config):
    """The loss of a run: Keras' cross-entropy of the logits, label-smoothed where the recipe asks."""
    from keras_attnconv.optim import LabelSmoothingCrossentropy

    if config.label_smoothing:
        return LabelSmoothingCrossentropy(config.label_smoothing, from_logits=True)
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _with_averaged_weights(config, *callbacks):
    """`callbacks` as they are, or run with the averaged weights in the model (validation too) for `ema_momentum`."""
    return [WithAveragedWeights(*callbacks)] if config.ema_momentum else list(callbacks)


def _accuracy_by_test_time_flips(config, plan, model, eval_data):
    """The final weights without and with test-time flips, image by image (`paired_accuracy_gain`), or None.

    Both come from one model without flips: its logits of the evaluation
    images and of their mirror images, whose mean is what a model with flips
    computes (`MirrorAverage`). It is the run's model where that has no flips,
    else a copy without them and with the same weights: one prediction to
    compile, not one per setting (seconds on a CPU, more under XLA on a GPU).
    Every run measures the choice. None for a run of several processes
    (TensorFlow's workers, JAX's processes), where no process holds every
    prediction.
    """
    from keras_attnconv.analysis.paired_accuracy import paired_accuracy_gain
    from keras_attnconv.training.input_pipeline import ArrayBatches

    if not _holds_every_prediction(config, plan):
        return None
    start = time.perf_counter()
    without_flips = model
    if model.config.test_time_flips:
        with build_scope(plan.strategy):
            without_flips = model.with_config(test_time_flips=False)
            without_flips.compile(jit_compile=model.jit_compile)
    batches = plan.eval_batches
    plain = without_flips.predict(eval_data, verbose=0)
    mirror_images = ArrayBatches(batches.images[:, :, ::-1], batches.labels, batch_size=batches.batch_size)
    mirrored = without_flips.predict(_model_input(plan, mirror_images), verbose=0)
    right_without = plain.argmax(-1) == batches.labels
    right_with = ((plain + mirrored) / 2).argmax(-1) == batches.labels
    # Its seconds (a compiled prediction and two passes) are part of the run's wall time: said apart.
    return {**paired_accuracy_gain(right_without, right_with), "seconds": time.perf_counter() - start}


def _model_input(plan, batches):
    """`batches` as the run's model takes them: tf.data on TensorFlow, which tf.distribute shards over workers."""
    from keras_attnconv.training.input_pipeline import as_tf_dataset

    return as_tf_dataset(batches) if uses_tf_data(plan.strategy) else batches


def _holds_every_prediction(config, plan):
    """Whether this process evaluates every image with the run's model: not in a run of several processes."""
    return not (config.strategy == "multi_worker" or process_shard(plan.strategy)[1] > 1)


def _fit(config, plan, run, resume_from=None):
    with run_scope(plan.strategy):
        return _fit_in_scope(config, plan, run, resume_from)


def _fit_in_scope(config, plan, run, resume_from):
    from keras_attnconv.models.step_compilation import describe_step_path, resolve_jit_compile_for
    from keras_attnconv.models.summary import trainable_parameters
    from keras_attnconv.models.training_state import build_training_state
    from keras_attnconv.training.input_pipeline import EpochSync
    from keras_attnconv.utils.reports import device_description, package_revision

    with build_scope(plan.strategy):
        if config.seed is not None:
            keras.utils.set_random_seed(config.seed)
        # Built from the config the plan validated, which is not validated again.
        model = plan.model_config.build(name=config.model, dtype=config.precision)
        if plan.preset_model is not None:  # a fine-tuning run (a resumed one then takes its backup's weights)
            start_from(model, plan.preset_model)
        jit_compile = resolve_jit_compile_for(model, config.jit_compile, config.precision)
        if config.verbose:
            print(
                f"Training step: {describe_step_path(jit_compile)} (jit_compile={config.jit_compile!r}, "
                f"{config.precision}); it is compiled during the first epoch, which takes longer (a minute or "
                f"more on a CPU)",
                file=sys.stderr,
            )
        # The model's dtype policy makes `compile` wrap the optimizer in a LossScaleOptimizer for mixed_float16.
        model.compile(
            optimizer=run_optimizer(config, plan.schedule),
            loss=run_loss(config),
            metrics=["accuracy"],
            jit_compile=jit_compile,
        )
        # ArrayBatches are a PyDataset, whose batch shapes `fit` cannot know without reading a batch.
        build_training_state(model, plan.train_batches.images, plan.train_batches.labels)
        backup = ResumableBackup(run.backup_dir)
        initial_epoch = backup.restore(model, resume_from)
    if initial_epoch:
        print(f"Resuming {run} from epoch {initial_epoch}/{config.epochs}", file=sys.stderr)
    # The records of an epoch after the last published one (a kill before its backup) are redone, not kept twice.
    rewind_csv(run.history, initial_epoch)
    if _tensorflow_importable():  # TensorBoard's logs are written only then (`_logging_callbacks`)
        rewind_event_files(run.logs_dir, initial_epoch, optimizer_steps(model.optimizer))
    throughput = Throughput(plan.steps_per_epoch * config.batch_size, run.epoch_seconds, initial_epoch)
    package = package_revision()  # the code that trains: a checkout may change before the run ends
    start = time.perf_counter()
    train_data, eval_data = _model_input(plan, plan.train_batches), _model_input(plan, plan.eval_batches)
    if config.strategy == "multi_worker":
        work_around_keras_multi_worker(model, plan.strategy, plan.eval_batches[0])
    history = model.fit(
        train_data,
        validation_data=eval_data,
        epochs=config.epochs,
        initial_epoch=initial_epoch,
        verbose=config.verbose,
        shuffle=False,  # the batches are shuffled by (seed, epoch), reproducibly
        callbacks=[
            EpochSync(plan.train_batches),
            StopOnNonFiniteLoss(),  # before any callback that writes
            StopWhenNothingLearned(
                plan.model_config.num_classes,
                len(plan.eval_batches.labels),
                first_judged_epoch(plan.schedule, plan.steps_per_epoch),
            ),
            # With weight averaging, validation and the best checkpoint see the averaged weights, the backup the
            # trained ones (and the averages as optimizer variables), so that a resumed run trains on as before.
            *_with_averaged_weights(
                config,
                BestCheckpoint(
                    run.best_checkpoint, first_epoch=first_trained_epoch(plan.schedule, plan.steps_per_epoch)
                ),
            ),
            *_logging_callbacks(run),
            throughput,
            *_center_tracking(model, run, initial_epoch),
            backup,  # last: an epoch is published as done once every record of it is written
        ],
    )
    loss, accuracy = _final_evaluation(model, eval_data, history, config.epochs)
    by_flips = _accuracy_by_test_time_flips(config, plan, model, eval_data)
    best_path = run.best_record
    # Last to use the model: a preset's metrics are measured with the best weights loaded into it.
    preset = _save_best_as_preset(config, plan, run, model, eval_data, (loss, accuracy)) if best_path.exists() else None
    metrics = {
        "model": config.model,
        "dataset": config.dataset,
        "eval_split": plan.eval_split,
        "eval_loss": float(loss),
        "eval_accuracy": float(accuracy),
        "eval_examples": len(plan.eval_batches.labels),  # the standard error of the accuracy depends on it
        "eval_accuracy_by_test_time_flips": by_flips,
        "best_val_accuracy": json.loads(best_path.read_text())["val_accuracy"] if best_path.exists() else None,
        "epochs": config.epochs,
        "optimizer_steps": optimizer_steps(model.optimizer),
        "trainable_parameters": trainable_parameters(model),
        "train_images_per_second": throughput.images_per_second,
        "precision": config.precision,
        "jit_compile": jit_compile,  # as resolved on this device ("auto" in the recipe)
        "step_path": describe_step_path(jit_compile),
        "replicas": plan.replicas,
        "wall_seconds_this_session": time.perf_counter() - start,
        "history": csv_history(run.history),  # every epoch, also those of the processes before a resume
        "machine": device_description(),  # the device and library versions, for results files (`attnconv table1`)
        "package": package,  # the code that trained it
        "preset": preset and str(preset),
    }
    run.write_metrics(metrics)
    metrics["run_dir"] = str(run)
    return metrics
