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

- ``.keras_attnconv.json``: the mark that makes it a preset of the package
  (`keras_attnconv.utils.ownership`).

This module is the preset directory's one owner. A preset is written under a
hidden staging name beside its directory (`keras_attnconv.utils.staging`), its
``metadata.json`` last, and renamed into place when complete, so a reader
never sees half of one. A preset is replaced only when asked
(``overwrite=True``) and only a preset: any other directory is an error naming
what it holds, and nothing is changed.
"""

import contextlib
import datetime
import errno
import hashlib
import json
import os
from pathlib import Path

import keras
import numpy as np

from keras_attnconv.models.image_classifier import ImageClassifier
from keras_attnconv.utils.checks import check_bool, check_path
from keras_attnconv.utils.files import check_free_space, check_writable, read_json, read_json_object
from keras_attnconv.utils.ownership import KINDS, ForeignDirectoryError, check_owned, mark_of, write_mark
from keras_attnconv.utils.staging import exchange, new_staging, remove, remove_stale_staging
from keras_attnconv.version import __version__

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
METADATA_FILE = "metadata.json"


def check_zoo_model(model, argument="model"):
    """Raises ValueError unless `model` is a model of the zoo (an `ImageClassifier`: it knows what it is)."""
    if not isinstance(model, ImageClassifier):
        raise ValueError(
            f"`{argument}` must be a keras_attnconv model (from build_model, from_preset, or a .keras "
            f"file of one), which knows its preprocessing and classes. Received: {argument} of class "
            f"{type(model).__name__}"
        )


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
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


KIND = "preset"


def save_to_preset(model, preset_dir, *, metadata=None, overwrite=False):
    """Saves `model` (a model of the zoo) as the preset directory `preset_dir`; returns its path.

    Args:
        model: an `AttentionClassifier` or `ResNet` (`build_model`, `from_preset`).
        preset_dir: the directory to write; its parent is created if needed.
            It must be absent, empty, or (with `overwrite`) a preset, and
            neither the working directory nor one holding it (``"."`` from
            inside a preset): a ValueError, as a rename cannot replace it.
        metadata: None or a dict of JSON-serializable fields added to
            ``metadata.json`` (e.g. ``{"metrics": {...}, "recipe": {...}}``);
            anything else is a ValueError naming it. A field that describes
            the model (`DESCRIBING_FIELDS`) must say what the model is: a
            contradiction is a ValueError naming the field and both values,
            before anything is written (`from_preset` would refuse the preset).
        overwrite: bool, replace the preset at `preset_dir`. Otherwise an
            existing preset is a FileExistsError; any other non-empty
            directory is a `ForeignDirectoryError` either way. Both are raised
            before anything is written.

    The preset is complete or absent: it is written beside `preset_dir` under
    a hidden name, ``metadata.json`` last, and renamed into place. With
    `overwrite`, the old preset and the new one swap names in one atomic step
    where the system allows it (Linux), so a kill at any moment leaves one of
    them, whole, at `preset_dir`.
    """
    check_zoo_model(model)
    check_bool("overwrite", overwrite)
    if not isinstance(metadata, (dict, type(None))):
        raise ValueError(
            f"`metadata` must be None or a dict of fields (a JSON object) added to metadata.json. "
            f"Received: metadata={metadata!r}"
        )
    check_writable(preset_dir, "preset_dir", beside=True)  # staged in its parent: a name the user gave, not ours
    given, preset_dir = preset_dir, Path(preset_dir)
    if preset_dir.is_symlink():  # the preset it points to is the one asked for
        preset_dir = preset_dir.resolve()
    working = Path.cwd()
    if preset_dir.resolve() in (working, *working.parents):
        raise ValueError(
            f"preset_dir={str(given)!r} is the working directory {working} or holds it: a preset is "
            f"published by renaming a whole directory onto it, which cannot replace the directory a "
            f"process works in. Save it from another directory. Received: preset_dir={str(given)!r}"
        )
    exists = FileExistsError(
        f"{preset_dir} exists: pass overwrite=True to replace it. Received: preset_dir={str(preset_dir)!r}"
    )
    check_owned(preset_dir, KIND, "preset_dir", adopt=_is_earlier_preset)
    if _is_our_preset(preset_dir) and not overwrite:
        raise exists
    record = {**model_metadata(model), **(metadata or {})}
    try:  # not JSON (a type, a NaN): an error before anything is written
        json.dumps(record, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"`metadata` must hold JSON values only: {error}. Received: metadata={metadata!r}") from None
    contradiction = _contradiction(model, metadata or {})
    if contradiction:  # from_preset would refuse the preset: it must not be written
        field, said, built = contradiction
        raise ValueError(
            f"`metadata` says {field}={said!r} where the model has {field}={built!r}: a preset's "
            f"metadata describes its model. Received: metadata[{field!r}]={said!r}"
        )
    # HDF5 crashes the process after a write that fails on a full disk: check the room first.
    check_free_space(preset_dir.parent, sum(w.nbytes for w in model.get_weights()), f"the preset {preset_dir.name}")
    prefix = f"{preset_dir.name}."
    remove_stale_staging(preset_dir.parent, prefix)
    staging = new_staging(preset_dir.parent, prefix)
    try:
        write_mark(staging, KIND)
        config = keras.saving.serialize_keras_object(model)
        for key in ("compile_config", "build_config"):  # a preset is the model, not its training state
            config.pop(key, None)
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, allow_nan=False) + "\n")
        with _without_optimizer(model):
            model.save_weights(staging / WEIGHTS_FILE)
        (staging / METADATA_FILE).write_text(json.dumps(record, indent=2, allow_nan=False) + "\n")  # last: whole
        _publish(staging, preset_dir, overwrite, exists)
    finally:
        remove(staging)
    return preset_dir


@contextlib.contextmanager
def _without_optimizer(model):
    """`model` without its optimizer for the block: Keras' ``save_weights`` saves a compiled model's optimizer state.

    A preset is the model, not its training state, which loading ignores: a
    run's best model, compiled to be evaluated, carried on the JAX backend
    the two slots per weight of a never-used Adam (the models' default
    optimizer), a 145 MB file for the 46 MB of the quadratic model's weights.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        yield
        return
    model.optimizer = None
    try:
        yield
    finally:
        model.optimizer = optimizer


def _publish(staging, preset_dir, overwrite, exists):
    """Renames the complete `staging` onto `preset_dir`; with `overwrite`, swaps it with the preset there."""
    if overwrite and _is_our_preset(preset_dir):
        if exchange(staging, preset_dir):
            if not _is_our_preset(staging):  # something else took the name meanwhile: give it back
                exchange(staging, preset_dir)
                raise ForeignDirectoryError(
                    f"{preset_dir} was replaced by something else during the save; it is "
                    f"left as it is. Received: preset_dir={str(preset_dir)!r}"
                )
            return  # the old preset now has the staging name, which the caller removes
        # No atomic exchange on this system: the old preset is moved aside first (a kill in between leaves
        # it, whole, under a hidden name beside `preset_dir`).
        retired = new_staging(preset_dir.parent, f"{preset_dir.name}.")
        os.rename(preset_dir, retired / preset_dir.name)
        os.rename(staging, preset_dir)
        remove(retired)
        return
    try:
        os.rename(staging, preset_dir)  # onto nothing or an empty directory: never replaces a preset
    except OSError as error:  # another save published it meanwhile
        if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
            raise
        raise exists from None


def _is_earlier_preset(path):
    """Whether an unmarked directory is a preset written by an earlier keras_attnconv (its metadata says so)."""
    try:
        record = read_json(Path(path) / METADATA_FILE)
    except (OSError, ValueError):
        return False
    return is_preset(path) and isinstance(record, dict) and "keras_attnconv_version" in record


def _is_our_preset(path):
    kind = mark_of(path)
    return kind == KIND or (kind is None and _is_earlier_preset(path))


def preset_digest(preset):
    """What a preset is, as ``"sha256:<hex>"`` of its files (names, sizes, bytes): a version exported from it
    records it (``source_digest``), and so does a run that starts from it (``init_from_digest``); its metadata.json
    holds the time it was written, so no two presets share it."""
    digest = hashlib.sha256()
    for file in sorted(path for path in Path(preset).rglob("*") if path.is_file()):
        content = file.read_bytes()
        digest.update(f"{file.relative_to(preset).as_posix()}\0{len(content)}\0".encode() + content)
    return f"sha256:{digest.hexdigest()}"


def is_preset(path):
    """Whether `path` is a preset directory (it has ``config.json`` and ``model.weights.h5``)."""
    path = Path(path)
    return (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file()


def _read_json_object(path, preset):
    """A preset's JSON file, which holds an object (a dict)."""
    return read_json_object(path, f"the preset is damaged. Received: preset={str(preset)!r}")


def load_preset_metadata(preset):
    """The ``metadata.json`` of a preset directory, as a dict."""
    _check_preset(preset)
    return _read_json_object(Path(preset) / METADATA_FILE, preset)


def _check_preset(preset):
    check_path("preset", preset)
    path = Path(preset)
    if not path.is_dir():
        raise FileNotFoundError(f"No preset directory at {str(preset)!r}. Received: preset={str(preset)!r}")
    kind = mark_of(path)
    if kind not in (None, KIND):  # e.g. a training run, whose best model is a preset one level down
        inner = [str(child) for child in sorted(path.iterdir()) if child.is_dir() and mark_of(child) == KIND]
        where = f": its preset is {inner[0]!r}" if len(inner) == 1 else ""
        raise FileNotFoundError(
            f"{str(preset)!r} is {KINDS[kind]}, not a preset{where}. Received: preset={str(preset)!r}"
        )
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE, METADATA_FILE) if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{str(preset)!r} is not a preset: it lacks {', '.join(missing)}. Received: preset={str(preset)!r}"
        )


#: What a preset's metadata says of its model, which must be what its config builds.
DESCRIBING_FIELDS = ("model", "class", "parameter_count", "preprocessing")


def _contradiction(model, metadata):
    """``(field, said, built)`` for the first of `DESCRIBING_FIELDS` that `metadata` gives otherwise than `model`.

    None where they agree; a field `metadata` lacks agrees (an earlier preset may lack one).
    """
    built = json.loads(json.dumps(model_metadata(model)))  # as JSON holds it: lists, not tuples
    for field in DESCRIBING_FIELDS:
        if field in metadata and json.loads(json.dumps(metadata[field])) != built[field]:
            return field, metadata[field], built[field]
    return None


def _check_metadata(model, metadata, preset):
    """Raises ValueError unless what ``metadata.json`` says of the model is what ``config.json`` builds."""
    contradiction = _contradiction(model, metadata)
    if contradiction:
        field, said, built = contradiction
        raise ValueError(
            f"The preset {str(preset)!r} disagrees with itself: metadata.json says {field}={said!r} "
            f"where config.json builds {field}={built!r}. Received: preset={str(preset)!r}"
        )


def _check_weights(model, path, preset):
    """Raises ValueError unless the weights file holds as many weights, of the same shapes, as the model has.

    Keras would drop extra weights without a word: another model's file
    must not load into this one. Only the model's own part of the file is
    compared (its layers and variables): a compiled model also saves its
    optimizer's state, which loading ignores.
    """
    import h5py  # Keras' own dependency for .weights.h5

    shapes = []

    def collect(name, item):
        if isinstance(item, h5py.Dataset) and name.startswith(("layers/", "vars/")):
            shapes.append(item.shape)

    try:
        with h5py.File(path, "r") as weights:
            weights.visititems(collect)
    except OSError as error:
        raise ValueError(
            f"The weights of the preset {str(preset)!r} cannot be loaded ({error}). Received: preset={str(preset)!r}"
        ) from None
    expected = [tuple(w.shape) for w in model.weights]
    if sorted(shapes) != sorted(expected):

        def count(found):
            return f"{len(found)} weights ({sum(int(np.prod(s)) for s in found)} values)"

        raise ValueError(
            f"The preset {str(preset)!r} disagrees with itself: model.weights.h5 holds {count(shapes)} "
            f"where the model of config.json, {model.name}, has {count(expected)}. "
            f"Received: preset={str(preset)!r}"
        )


def check_preset_class(found, model_class, preset):
    """Raises ValueError, naming both classes, where the model of `preset` (a `found`) is not a `model_class`:
    ``ResNet.from_preset`` of an attention model's preset, as keras-hub refuses a preset of another task."""
    if not issubclass(found, model_class):
        raise ValueError(
            f"{str(preset)!r} holds a model of class {found.__name__}, not {model_class.__name__}: load it with "
            f"{found.__name__}.from_preset, or keras_attnconv.from_preset, which loads any model of the package. "
            f"Received: preset={str(preset)!r}"
        )


def load_preset(preset, *, dtype=None, load_weights=True, model_class=ImageClassifier):
    """The model saved in the preset directory `preset`, as its own class, with its weights (`from_preset`'s path).

    Args:
        preset: a preset directory (`save_to_preset`; ``attnconv train``
            writes the best model of a run to ``<run>/preset``).
        dtype: None (the policy it was saved with) or a dtype policy to
            rebuild it in (``"float32"``, ``"mixed_bfloat16"``, ...).
        load_weights: False gives the architecture with fresh weights.
        model_class: the class the model must be (or subclass): a preset of
            another is a ValueError naming both, before anything is built.

    Only the package's own model classes are loaded, in Keras' safe mode: a
    preset cannot make this function run code. Its three files are checked
    against each other first: ``metadata.json`` must name the model, class,
    parameter count and preprocessing that ``config.json`` builds, and
    ``model.weights.h5`` must hold that model's weights, no more and no
    fewer (Keras alone would drop extra ones); a disagreement is a
    ValueError naming the preset and what disagrees. A run directory given
    as the preset is an error naming its ``preset/``.
    """
    check_bool("load_weights", load_weights)
    _check_preset(preset)
    path = Path(preset)
    config = _read_json_object(path / CONFIG_FILE, preset)
    metadata = _read_json_object(path / METADATA_FILE, preset)
    registered = config.get("registered_name")
    found = keras.saving.get_registered_object(registered) if isinstance(registered, str) else None
    if not (isinstance(found, type) and issubclass(found, ImageClassifier) and isinstance(config.get("config"), dict)):
        raise ValueError(
            f"The preset {str(preset)!r} does not hold a keras_attnconv model. Received: registered_name={registered!r}"
        )
    check_preset_class(found, model_class, preset)
    if dtype is not None:
        config = {**config, "config": {**config["config"], "dtype": dtype}}
    model = keras.saving.deserialize_keras_object(config, safe_mode=True)
    _check_metadata(model, metadata, preset)
    if load_weights:
        _check_weights(model, path / WEIGHTS_FILE, preset)
        try:
            model.load_weights(path / WEIGHTS_FILE)
        except Exception as error:  # h5py's and Keras' errors for a damaged or mismatched file
            raise ValueError(
                f"The weights of the preset {str(preset)!r} cannot be loaded into its model ({error}). "
                f"Received: preset={str(preset)!r}"
            ) from None
    return model
