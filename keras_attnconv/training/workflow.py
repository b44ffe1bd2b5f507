"""`attnconv train` as two steps: train a run (`keras_attnconv.training`), then export it for serving.

Training knows nothing of serving: a finished run is a finished
`RunDirectory`. The export step records its SavedModel in the run
(``export.json``) when it is published, so running the same command again
after a crash during the export finishes the export instead of training a new run.
The published version names what it was exported from (its preset's digest,
``source_digest`` in its metadata), so a crash between the publication and
``export.json`` is finished by recording that version, never by publishing
the run again.
"""

import os
import sys
from pathlib import Path

import keras

from keras_attnconv.export.exporter import export_model, served_version
from keras_attnconv.export.root import ExportRoot
from keras_attnconv.models.presets import load_preset, load_preset_metadata, preset_digest
from keras_attnconv.training.callbacks import NothingLearnedError, at_chance, describe_chance
from keras_attnconv.training.fit import train
from keras_attnconv.training.plan import plan_run
from keras_attnconv.training.run_directory import RunDirectory, preset_of
from keras_attnconv.training.runs import finished_run, resolve_run_dir
from keras_attnconv.utils.checks import check_bool


def unexported_run(config):
    """The latest finished run of `config` (same settings) whose export never completed, or None."""
    if not config.export_dir:
        return None
    finished = finished_run(config)
    return None if finished is None or finished.is_exported() else finished


def export_run(config, run):
    """Exports the best model of a finished run (its preset) to ``config.export_dir``; returns the version or None.

    The served version of ``models.config`` does not move (a model's first
    export is served): ``attnconv serve`` or ``attnconv export --serve`` chooses it.

    Without TensorFlow, or on another backend (e.g. JAX on a GPU machine), the
    export is skipped with a message saying how to run it later; a run whose
    best model learned nothing is refused there too (`NothingLearnedError`), as
    that later export would refuse it.
    """
    if keras.backend.backend() != "tensorflow":  # (the TensorFlow backend implies TensorFlow is installed)
        preset = preset_of(run.path)
        refuse_learned_nothing(run.path, preset, load_preset_metadata(preset))
        named = f" --name {config.export_name}" if config.export_name else ""
        print(
            f"Export needs TensorFlow (installed, and as the Keras backend), so {run} was not exported for "
            f"serving. Where TensorFlow is installed, run: KERAS_BACKEND=tensorflow attnconv export "
            f"{run} --export-dir {config.export_dir}{named}",
            file=sys.stderr,
        )
        return None

    with run.lock():
        digest = preset_digest(preset_of(run.path))  # read once: the preset holds the model's weights
        path = published_export(run, config.export_dir, digest, config.export_name) or export_source(
            run.path, config.export_dir, digest=digest, serving_name=config.export_name
        )
        run.record_export(path)
    served = served_version(config.export_dir, path.parent.name)
    if served != int(path.name):
        print(
            f"Exported {path}; models.config serves version {served} of {path.parent.name}. To serve this one: "
            f"attnconv serve {path.parent.name} {path.name} --export-dir {config.export_dir}",
            file=sys.stderr,
        )
    return path


def published_export(run, export_dir, digest, serving_name=None):
    """The version of `export_dir` already exported from `run`'s preset (`digest`: its ``source_digest``), or None.

    It is looked for under `serving_name` (None: the model's own name).

    A run killed after its export was published but before ``export.json``
    was written is found so: the same command then records that version
    (merging it into ``models.config``, which the kill may have come before)
    instead of publishing the run again.
    """
    preset = preset_of(run.path)
    root = ExportRoot(export_dir)
    path = root.version_exported_from(serving_name or load_preset_metadata(preset)["model"], digest)
    if path is not None:
        root.update_models_config()
        print(f"{run} was already exported as {path}; recording it.", file=sys.stderr)
    return path


def check_apart(run, export_dir):
    """Raises ValueError, naming both, if the run directory and the export root are one inside the other.

    Each has its own owner, which refuses the other's directory: found after
    the training, the export would be refused, so it is refused before.
    """
    run_path, export_path = Path(run).resolve(), Path(export_dir).resolve()
    if run_path == export_path:
        relation = "is the run directory"
    elif run_path in export_path.parents:
        relation = "is inside the run directory"
    elif export_path in run_path.parents:
        relation = "holds the run directory"
    else:
        return
    raise ValueError(
        f"The export root {export_dir} {relation} {run}: a run and an export root are separate "
        f"directories, neither inside the other. Pass another --export-dir (or --run-dir). "
        f"Received: run_dir={str(run)!r}, export_dir={str(export_dir)!r}"
    )


def train_and_export(config):
    """Trains `config` (or takes its finished, unexported run) and exports the best checkpoint; returns metrics.

    An export root that could not be written, that is inside the run directory (or holds it), or whose versions of
    the model's name take another input or give other classes (`ExportRoot.check_same_answers`: a fine-tuned model,
    or one trained on another dataset), is an error before the training, not after it. A run that learned
    nothing is never exported: one stopped by `StopWhenNothingLearned` raises before the export, and a finished
    run whose best model is at chance is refused by `export_source` (`NothingLearnedError` either way).
    """
    run = unexported_run(config)
    if config.export_dir:
        check_apart(run or resolve_run_dir(config), config.export_dir)
    if config.export_dir:
        # On another backend the export is left for later, where TensorFlow is (`export_run`); the root it names is
        # checked now all the same, but for its models.config, which only TensorFlow's side reads.
        root = ExportRoot(config.export_dir)
        root.check(models_config=keras.backend.backend() == "tensorflow")
    if run is None:
        plan = plan_run(config)
        if config.export_dir:  # the model to be trained must answer as the versions of its name there do
            root.check_same_answers(config.export_name or config.model, plan.model_config.preprocessing)
        metrics = train(config, plan)
        run = RunDirectory(metrics["run_dir"])
    else:
        print(f"{run} finished training but was not exported; exporting it.", file=sys.stderr)
        metrics = run.finished_metrics()
    if config.export_dir and metrics.get("chief", True):
        path = export_run(config, run)
        if path is not None:
            metrics["export"] = str(path)
    return metrics


def export_source(source, export_dir=None, *, allow_chance=False, digest=None, **kwargs):
    """Exports the model of a training run or a preset (`preset_of`), with its metadata; see `export_model`.

    A model whose recorded validation accuracy (the preset's ``metrics``) is at
    chance (`callbacks.at_chance`: within 2 standard errors of 1/classes on its
    ``eval_examples`` images) learned nothing, and is refused with
    `NothingLearnedError` before any work, unless `allow_chance` is True; its
    ``metadata.json`` then records ``"allow_chance": true`` and what was at
    chance (``"at_chance"``). A preset that records no accuracy, or too few
    images to tell (`callbacks.chance_interval`), is exported as it is.
    `digest` is the preset's `preset_digest`, where the caller has it already.
    """
    check_bool("allow_chance", allow_chance)
    root = ExportRoot(export_dir, kwargs.get("format", "saved_model"))
    root.check()  # before loading
    preset = preset_of(source)
    recorded = load_preset_metadata(preset)
    chance = refuse_learned_nothing(source, preset, recorded, allow_chance=allow_chance)
    checked = {"allow_chance": True, **({"at_chance": chance} if chance else {})} if allow_chance else {}
    # Seen from the export root: an absolute path of this machine would mean nothing where the export is served.
    metadata = {
        **recorded,
        "source": os.path.relpath(preset.resolve(), root.path.resolve()),
        "source_digest": digest or preset_digest(preset),
        **checked,
        **(kwargs.pop("metadata", None) or {}),
    }
    return export_model(load_preset(preset), export_dir, metadata=metadata, **kwargs)


def refuse_learned_nothing(source, preset, metadata, *, allow_chance=False):
    """Raises `NothingLearnedError` where `preset`'s recorded accuracy is at chance, unless `allow_chance`.

    Returns what is at chance (`_recorded_chance`), or None. `source` is the
    run or preset the user named, `metadata` the preset's ``metadata.json``.
    """
    chance = _recorded_chance(preset, metadata)
    if chance is not None and not allow_chance:
        backend = "" if keras.backend.backend() == "tensorflow" else "KERAS_BACKEND=tensorflow "  # export needs it
        raise NothingLearnedError(
            f"{source} holds a model that learned nothing, which is not exported: its recorded validation "
            f"{describe_chance(chance['eval_accuracy'], chance['classes'], chance['eval_examples'])}. Train again "
            f"(longer, with a longer warm-up: --warmup-ratio, or a lower --learning-rate); to export it anyway: "
            f"{backend}attnconv export {source} --allow-chance (allow_chance=True), which its metadata.json records. "
            f"Received: source={str(source)!r}"
        )
    return chance


def _recorded_chance(preset, metadata):
    """What is at chance in a preset's recorded metrics (`at_chance`), as a dict for metadata.json, or None.

    The accuracy is the preset's own (``metrics.eval_accuracy``: its weights'), the classes its class names,
    the images ``metrics.eval_examples``, or, for a preset written before it recorded them, its training run's
    ``metrics.json`` (the same evaluation split). None where any of them is missing.
    """

    def field(record, name, kind):
        value = record.get(name) if isinstance(record, dict) else None
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    metrics, preprocessing = metadata.get("metrics"), metadata.get("preprocessing")
    accuracy, examples = field(metrics, "eval_accuracy", (int, float)), field(metrics, "eval_examples", int)
    class_names = field(preprocessing, "class_names", list)
    if examples is None and isinstance(metadata.get("training_run"), str):
        run = RunDirectory(Path(preset) / metadata["training_run"])
        try:
            examples = field(run.finished_metrics(), "eval_examples", int) if run.is_finished() else None
        except (OSError, ValueError):  # an unreadable record of the run: nothing to tell from
            examples = None
    if accuracy is None or examples is None or class_names is None:
        return None
    interval = at_chance(float(accuracy), len(class_names), examples)
    if interval is None:
        return None
    return {
        "eval_accuracy": float(accuracy),
        "eval_examples": examples,
        "classes": len(class_names),
        "chance_interval": [interval[0], interval[1]],
    }
