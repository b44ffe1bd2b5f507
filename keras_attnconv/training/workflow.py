"""`attnconv train` as two steps: train a run (`keras_attnconv.training`), then export it for serving.

Training knows nothing of serving: a finished run is a finished
`RunDirectory`. The export step records its SavedModel in the run
(``export.json``) when it is published, so running the same command again
after a crash during the export finishes the export instead of training a new run.
"""

import os
import sys

import keras

from keras_attnconv.export.root import ExportRoot
from keras_attnconv.export.exporter import export_model, served_version
from keras_attnconv.models.presets import from_preset, load_preset_metadata
from keras_attnconv.training.fit import train
from keras_attnconv.training.run_directory import RunDirectory, preset_of
from keras_attnconv.training.runs import finished_run


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
    export is skipped with a message saying how to run it later.
    """
    if keras.backend.backend() != "tensorflow":  # (the TensorFlow backend implies TensorFlow is installed)
        print(f"Export needs TensorFlow (installed, and as the Keras backend), so {run} was not exported for "
              f"serving. Where TensorFlow is installed, run: KERAS_BACKEND=tensorflow attnconv export "
              f"{run} --export-dir {config.export_dir}", file=sys.stderr)
        return None

    with run.lock():
        path = export_source(run.path, config.export_dir)
        run.record_export(path)
    served = served_version(config.export_dir, path.parent.name)
    if served != int(path.name):
        print(f"Exported {path}; models.config serves version {served} of {path.parent.name}. To serve this one: "
              f"attnconv serve {path.parent.name} {path.name} --export-dir {config.export_dir}", file=sys.stderr)
    return path


def train_and_export(config):
    """Trains `config` (or takes its finished, unexported run) and exports the best checkpoint; returns metrics.

    An export root that could not be written is an error before the training, not after it.
    """
    if config.export_dir and keras.backend.backend() == "tensorflow":
        ExportRoot(config.export_dir).check()
    run = unexported_run(config)
    if run is None:
        metrics = train(config)
        run = RunDirectory(metrics["run_dir"])
    else:
        print(f"{run} finished training but was not exported; exporting it.", file=sys.stderr)
        metrics = run.finished_metrics()
    if config.export_dir and metrics.get("chief", True):
        path = export_run(config, run)
        if path is not None:
            metrics["export"] = str(path)
    return metrics


def export_source(source, export_dir=None, **kwargs):
    """Exports the model of a training run or a preset (`preset_of`), with its metadata; see `export_model`."""
    root = ExportRoot(export_dir, kwargs.get("format", "saved_model"))
    root.check()  # before loading
    preset = preset_of(source)
    # Seen from the export root: an absolute path of this machine would mean nothing where the export is served.
    metadata = {**load_preset_metadata(preset), "source": os.path.relpath(preset.resolve(), root.path.resolve()),
                **(kwargs.pop("metadata", None) or {})}
    return export_model(from_preset(preset), export_dir, metadata=metadata, **kwargs)
