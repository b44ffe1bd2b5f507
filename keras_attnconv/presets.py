"""Presets: a model of the zoo with its weights and what it is, in one directory (keras-hub's layout).

A preset directory holds:

- ``config.json``: the model as ``keras.saving.serialize_keras_object`` writes it
  (module, class, constructor arguments: the architecture, the input size, the
  normalisation statistics and the class names);
- ``model.weights.h5``: the weights;
- ``metadata.json``: the model's name and class, its parameter count, the
  preprocessing a client needs (input dtype and shape, normalisation, class
  names), the Keras and keras_attnconv versions, the date, and what the saver
  adds (``attnconv train``: the recipe and the metrics of these exact weights).

A preset is written under a hidden staging name beside its directory
(`keras_attnconv.staging`) and renamed into place when complete, so a reader
never sees half of one, and a preset is never overwritten unless asked.
"""

import datetime
import errno
import json
import os
import shutil
from pathlib import Path

import keras

from keras_attnconv.models import ImageClassifier
from keras_attnconv.staging import new_staging, remove_stale_staging
from keras_attnconv.utils import check_free_space
from keras_attnconv.version import __version__

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
METADATA_FILE = "metadata.json"


def check_zoo_model(model, argument="model"):
    """Raises ValueError unless `model` is a model of the zoo (an `ImageClassifier`: it knows what it is)."""
    if not isinstance(model, ImageClassifier):
        raise ValueError(f"`{argument}` must be a keras_attnconv model (from build_model, from_preset, or a .keras "
                         f"file of one), which knows its preprocessing and classes. Received: {argument} of class "
                         f"{type(model).__name__}")


def model_metadata(model):
    """What a model says about itself, for a preset's or an export's metadata."""
    return {
        "model": model.name,
        "class": keras.saving.get_registered_name(type(model)),
        "dtype_policy": model.dtype_policy.name,
        "parameter_count": int(model.count_params()),
        "preprocessing": model.preprocessing,
        "keras_version": keras.__version__,
        "keras_attnconv_version": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def save_to_preset(model, preset_dir, *, metadata=None, overwrite=False):
    """Saves `model` (a model of the zoo) as the preset directory `preset_dir`; returns its path.

    Args:
        model: an `AttentionClassifier` or `ResNet` (`build_model`, `from_preset`).
        preset_dir: the directory to write; its parent is created if needed.
        metadata: JSON-serializable fields added to ``metadata.json`` (e.g.
            ``{"metrics": {...}, "recipe": {...}}``).
        overwrite: replace an existing preset at `preset_dir`. Otherwise an
            existing, non-empty `preset_dir` is a FileExistsError, raised
            before anything is written.

    The preset is complete or absent: it is written beside `preset_dir` under
    a hidden name and renamed into place. (With `overwrite`, the old preset is
    renamed away just before: a kill between the two renames leaves both,
    complete, under hidden names, and none at `preset_dir` until the next save.)
    """
    check_zoo_model(model)
    preset_dir = Path(preset_dir)
    exists = FileExistsError(f"{preset_dir} exists: pass overwrite=True to replace it. "
                             f"Received: preset_dir={str(preset_dir)!r}")
    if not overwrite and preset_dir.exists() and (not preset_dir.is_dir() or any(preset_dir.iterdir())):
        raise exists
    record = {**model_metadata(model), **(metadata or {})}
    json.dumps(record)  # not serializable: TypeError before anything is written
    # HDF5 crashes the process after a write that fails on a full disk: check the room first.
    check_free_space(preset_dir.parent, sum(w.nbytes for w in model.get_weights()), f"the preset {preset_dir.name}")
    prefix = f"{preset_dir.name}."
    remove_stale_staging(preset_dir.parent, prefix)
    staging, retired = new_staging(preset_dir.parent, prefix), None
    try:
        config = keras.saving.serialize_keras_object(model)
        for key in ("compile_config", "build_config"):  # a preset is the model, not its training state
            config.pop(key, None)
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        model.save_weights(staging / WEIGHTS_FILE)
        (staging / METADATA_FILE).write_text(json.dumps(record, indent=2) + "\n")
        if overwrite and preset_dir.exists():
            retired = new_staging(preset_dir.parent, prefix)
            os.rename(preset_dir, retired / preset_dir.name)
        try:
            os.rename(staging, preset_dir)
        except OSError as error:  # another save published it meanwhile: the rename never replaces a preset
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                raise
            raise exists from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)
    return preset_dir


def is_preset(path):
    """Whether `path` is a preset directory (it has ``config.json`` and ``model.weights.h5``)."""
    path = Path(path)
    return (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file()


def preset_of(source):
    """The preset directory of `source`: a training run directory (its ``preset/``) or a preset directory."""
    source = Path(source)
    if is_preset(source / "preset"):
        return source / "preset"
    if is_preset(source):
        return source
    raise FileNotFoundError(f"{str(source)!r} is neither a finished training run (with preset/) nor a preset "
                            f"directory (config.json, model.weights.h5). Received: source={str(source)!r}")


def _read_json(path, preset):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"The preset {str(preset)!r} has an unreadable {path.name} ({error}). "
                         f"Received: preset={str(preset)!r}") from None


def load_preset_metadata(preset):
    """The ``metadata.json`` of a preset directory, as a dict."""
    _check_preset(preset)
    return _read_json(Path(preset) / METADATA_FILE, preset)


def _check_preset(preset):
    path = Path(preset)
    if not path.is_dir():
        raise FileNotFoundError(f"No preset directory at {str(preset)!r}. Received: preset={str(preset)!r}")
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE, METADATA_FILE) if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{str(preset)!r} is not a preset: it lacks {', '.join(missing)}. "
                                f"Received: preset={str(preset)!r}")


def from_preset(preset, *, dtype=None, load_weights=True):
    """The model saved in the preset directory `preset`, as its own class, with its weights.

    Args:
        preset: a preset directory (`save_to_preset`; ``attnconv train``
            writes the best model of a run to ``<run>/preset``).
        dtype: None (the policy it was saved with) or a dtype policy to
            rebuild it in (``"float32"``, ``"mixed_bfloat16"``, ...).
        load_weights: False gives the architecture with fresh weights.

    Only the package's own model classes are loaded, in Keras' safe mode: a
    preset cannot make this function run code.
    """
    _check_preset(preset)
    path = Path(preset)
    config = _read_json(path / CONFIG_FILE, preset)
    registered = config.get("registered_name") if isinstance(config, dict) else None
    model_class = keras.saving.get_registered_object(registered) if isinstance(registered, str) else None
    if not (isinstance(model_class, type) and issubclass(model_class, ImageClassifier)
            and isinstance(config.get("config"), dict)):
        raise ValueError(f"The preset {str(preset)!r} does not hold a keras_attnconv model. "
                         f"Received: registered_name={registered!r}")
    if dtype is not None:
        config = {**config, "config": {**config["config"], "dtype": dtype}}
    model = keras.saving.deserialize_keras_object(config, safe_mode=True)
    if load_weights:
        try:
            model.load_weights(path / WEIGHTS_FILE)
        except Exception as error:  # h5py's and Keras' errors for a damaged or mismatched file
            raise ValueError(f"The weights of the preset {str(preset)!r} cannot be loaded into its model ({error}). "
                             f"Received: preset={str(preset)!r}") from None
    return model
