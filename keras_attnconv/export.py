"""Export of a model of the zoo, under its own name, as a TF Serving SavedModel, an ONNX file or a LiteRT file.

Every export is ``<export_dir>/<name>/<version>/``: ``<name>`` is the
model's own name (``model.name``, the registered name for `build_model`), or a
serving name given explicitly, which must be a plain name (letters, digits,
``_``, ``-``, ``.``; never a path) and is recorded beside the model's real name
in ``metadata.json``. Nothing is written outside `export_dir`.

- ``saved_model`` (TF Serving): the signature ``serving_default`` takes
  ``images``: uint8 ``[batch, H, W, 3]`` and returns ``probabilities``
  (float32 ``[batch, classes]``), ``classes`` (int64 ``[batch]``) and
  ``class_names`` (string ``[batch]``); ``assets.extra/`` holds the warm-up
  requests TF Serving replays at load time and ``metadata.json``.
- ``onnx`` (onnxruntime) and ``litert`` (the LiteRT interpreter): the model
  itself, ``model.onnx`` or ``model.tflite``, from ``images`` (uint8) to
  float32 logits, with ``metadata.json`` beside it (the ONNX file also carries
  the model's name and class names in its metadata properties).

The models take the raw pixels and normalise them themselves, so every format
takes uint8 images. A model trained in mixed precision is exported as its
float32 copy.

Each version directory is written under a hidden staging name
(`keras_attnconv.staging`) and renamed onto its number at the end, so a
server never sees half an export. The rename is also how a version number is
claimed: concurrent exports of one model end on distinct versions, and an
existing version is never overwritten. Staging directories left by killed
exports are removed by the next export.

``models.config`` (TF Serving's ``--model_config_file``) lists every
SavedModel model under the export root, each with the one version it serves
(``model_version_policy { specific { versions: N } }``). Publishing a version
does not change the served one: a model's first version is served when it
appears, and `set_served_version` (``attnconv serve``, or ``attnconv export
--serve``) moves it.
"""

import errno
import json
import os
import re
import shutil
from pathlib import Path

import keras
import numpy as np

from keras_attnconv.presets import check_zoo_model, from_preset, load_preset_metadata, model_metadata, preset_of
from keras_attnconv.staging import new_staging, remove_stale_staging
from keras_attnconv.utils import check_choice, check_writable, file_lock, write_atomically

FORMATS = ("saved_model", "onnx", "litert")
#: The export root of each format when none is given.
DEFAULT_EXPORT_DIRS = {"saved_model": "saved_models", "onnx": "onnx_models", "litert": "litert_models"}
#: The file that makes a version directory a version of each format.
VERSION_FILES = {"saved_model": "saved_model.pb", "onnx": "model.onnx", "litert": "model.tflite"}
WARMUP_FILE = "tf_serving_warmup_requests"
WARMUP_BATCH_SIZES = (1, 8)
MODELS_CONFIG = "models.config"
SERVING_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def export_root(export_dir, format="saved_model"):
    """The export root: `export_dir`, or the format's default (`DEFAULT_EXPORT_DIRS`) when it is None."""
    return Path(export_dir or DEFAULT_EXPORT_DIRS[format])


def check_serving_name(name, argument="serving_name"):
    """Raises ValueError unless `name` is a plain directory name: never a path, never hidden."""
    if not isinstance(name, str) or not SERVING_NAME.fullmatch(name) or len(name) > 200:
        raise ValueError(f"`{argument}` must be a name of letters, digits, '_', '-' and '.', starting with a letter "
                         f"or digit (never a path). Received: {argument}={name!r}")
    return name


def check_version(version):
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise ValueError(f"`version` must be a positive integer or None. Received: version={version!r}")


def float32_copy(model):
    """The model to export: `model` itself in float32, else its float32 copy (same class, config and weights)."""
    return model if model.dtype_policy.name == "float32" else model.with_config(dtype="float32")


def next_version(model_dir):
    """1 + the largest numeric version under `model_dir` (1 if none)."""
    versions = [int(p.name) for p in Path(model_dir).glob("*") if p.is_dir() and p.name.isdigit()]
    return max(versions, default=0) + 1


def _versions(model_dir, format):
    """The version numbers under `model_dir` that hold an export of `format`, ascending."""
    return sorted(int(p.name) for p in Path(model_dir).iterdir()
                  if p.is_dir() and p.name.isdigit() and (p / VERSION_FILES[format]).exists())


def _check_one_format(model_dir, format):
    """A model directory holds versions of one format: a server of one must not meet the other."""
    if not model_dir.is_dir():
        return
    for other in FORMATS:
        if other != format and _versions(model_dir, other):
            raise ValueError(f"{model_dir} holds {other} versions: export {format} to another export_dir "
                             f"(default {DEFAULT_EXPORT_DIRS[format]!r}). Received: format={format!r}")


def require_tensorflow_backend():
    """Raises RuntimeError unless Keras runs on TensorFlow: every format is traced by TensorFlow."""
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(f"Export traces the model with TensorFlow and needs the TensorFlow backend; Keras runs on "
                           f"{keras.backend.backend()!r}. Run it as KERAS_BACKEND=tensorflow attnconv export ...")


def _check_writable(export_dir, *subdirs):
    """Fails before any work if a version or ``models.config`` could not be written."""
    for path in (Path(export_dir), *subdirs):
        check_writable(path, "export_dir")


def _version_exists(target, version):
    return FileExistsError(f"{target} exists: versions are never overwritten. Pass another `version`, "
                           f"or version=None for the next free one. Received: version={version}")


def _publish(staging, model_dir, version, info, metadata_path):
    """Renames the complete `staging` directory onto its version number; returns the version directory.

    The rename is the atomic claim of the number: when two exports pick the
    same next version, the second rename fails (the first one's directory is
    not empty) and, with ``version=None``, moves on to the next number.
    """
    candidate = next_version(model_dir) if version is None else version
    while True:
        target = model_dir / str(candidate)
        info["version"] = candidate  # metadata.json names the version, so it is written per try
        (staging / metadata_path).write_text(json.dumps(info, indent=2) + "\n")
        try:
            os.rename(staging, target)  # atomic: a server sees all of the version or none of it
            return target
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                raise
            if version is not None:
                raise _version_exists(target, version) from None
            candidate += 1


def _serving_function(model):
    import tensorflow as tf

    names = tf.constant(list(model.class_names), tf.string)

    def serve(images):
        probabilities = tf.nn.softmax(tf.cast(model(images, training=False), tf.float32), axis=-1)
        classes = tf.argmax(probabilities, axis=-1, output_type=tf.int64)
        return {"probabilities": probabilities, "classes": classes, "class_names": tf.gather(names, classes)}

    return serve


def _write_warmup(version_dir, serving_name, image_shape):
    """TF Serving warm-up records (PredictionLog protos) built with tensorflow-serving-api."""
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    path = version_dir / "assets.extra" / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for batch in WARMUP_BATCH_SIZES:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=serving_name, signature_name="serving_default"))
            images = rng.integers(0, 256, (batch, *image_shape), dtype=np.uint8)
            request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path


def _write_saved_model(model, staging, serving_name, jit_compile, warmup):
    import tensorflow as tf

    image_shape = tuple(int(d) for d in model.input_shape[1:])
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", _serving_function(model),
                         input_signature=[tf.TensorSpec((None, *image_shape), tf.uint8, name="images")],
                         jit_compile=jit_compile)
    archive.write_out(str(staging), verbose=False)
    if warmup:
        _write_warmup(staging, serving_name, image_shape)
    (staging / "assets.extra").mkdir(exist_ok=True)
    return {"inputs": {"images": ["uint8", [None, *image_shape]]},
            "outputs": {"probabilities": ["float32", [None, model.config.num_classes]],
                        "classes": ["int64", [None]], "class_names": ["string", [None]]}}


def _needs(module, format):
    try:
        __import__(module)
    except ImportError:
        raise ModuleNotFoundError(f"The {format} export needs {module}: pip install 'keras-attnconv[export]'. "
                                  f"Received: format={format!r}") from None


def _write_single_file(model, staging, format, description):
    """ONNX and LiteRT: Keras' own export of the model (uint8 images -> logits)."""
    if format == "onnx":
        _needs("tf2onnx", format)
    import tensorflow as tf

    size = model.config.image_size
    path = staging / VERSION_FILES[format]
    # The signature given, not taken from the model: Keras' own needs a model that has been called once.
    signature = [tf.TensorSpec((None, size, size, 3), tf.uint8, name="images")]
    model.export(str(path), format=format, verbose=False, input_signature=signature)
    if format == "onnx":
        import onnx

        proto = onnx.load(str(path))
        # The output named for what it is (tf2onnx names it after the traced graph's "Identity:0").
        proto.graph.node.append(onnx.helper.make_node("Identity", [proto.graph.output[0].name], ["logits"]))
        proto.graph.output[0].name = "logits"
        # The file says what it is, as the SavedModel's metadata.json does.
        for key, value in (("keras_attnconv", json.dumps(description)),
                           ("class_names", json.dumps(list(model.class_names)))):
            proto.metadata_props.add(key=key, value=value)
        onnx.checker.check_model(proto)
        onnx.save(proto, str(path))
    return {"inputs": {"images": ["uint8", [None, size, size, 3]]},
            "outputs": {"logits": ["float32", [None, model.config.num_classes]]}}


def export_model(model, export_dir=None, *, format="saved_model", version=None, serving_name=None, serve=False,
                 jit_compile=False, metadata=None, warmup=True, base_path="/models"):
    """Exports a model of the zoo as ``export_dir/<name>/<version>/``; returns the version directory.

    Args:
        model: an `AttentionClassifier` or `ResNet` (`build_model`,
            `from_preset`): it knows its input size, normalisation and class
            names. Exported in float32 whatever its dtype policy.
        export_dir: export root (default: `DEFAULT_EXPORT_DIRS` of the format).
        format: ``"saved_model"`` (TF Serving), ``"onnx"`` or ``"litert"``.
        version: int or None (next free version, also when concurrent
            exports of the same model race). An existing version is never
            overwritten: FileExistsError.
        serving_name: the directory (and TF Serving model) name, default
            ``model.name``; a plain name, recorded beside the model's own.
        serve: SavedModel only: make this version the one ``models.config``
            serves (otherwise the served version stays as it was; a new model
            serves its first version).
        jit_compile: SavedModel only: an XLA-compiled serving function
            instead of a plain graph.
        metadata: extra JSON-serializable fields for ``metadata.json``.
        warmup: SavedModel only: write ``assets.extra/tf_serving_warmup_requests``.
        base_path: where TF Serving finds `export_dir` (``models.config``'s base paths).

    Raises:
        ValueError: a model not of the zoo, a bad name, format or version,
            an export root whose model directory holds another format, or
            a ``models.config`` there that is not TF Serving's.
        PermissionError, NotADirectoryError: `export_dir` cannot be written.
        All are raised before any work; nothing is written.
    """
    check_zoo_model(model)
    check_choice("format", format, FORMATS)
    name = check_serving_name(serving_name) if serving_name is not None else check_serving_name(model.name, "name")
    check_version(version)
    if format != "saved_model" and (serve or jit_compile):
        raise ValueError(f"`serve` and `jit_compile` apply to SavedModels. Received: format={format!r}")
    export_dir = export_root(export_dir, format)
    model_dir = export_dir / name
    require_tensorflow_backend()
    _check_writable(export_dir, model_dir)
    _check_one_format(model_dir, format)
    if version is not None and (model_dir / str(version)).exists():
        raise _version_exists(model_dir / str(version), version)  # fail before the work; rechecked at publication
    if format == "saved_model":
        _read_models_config(export_dir / MODELS_CONFIG)  # one TF Serving cannot read: an error before the work
    json.dumps(metadata)  # not serializable: TypeError before the work

    exported = float32_copy(model)
    remove_stale_staging(model_dir)
    staging = new_staging(model_dir)
    info = {**(metadata or {}), **model_metadata(exported), "config": exported.get_config(), "serving_name": name,
            "format": format, "version": None}
    try:
        if format == "saved_model":
            info["signature"] = _write_saved_model(exported, staging, name, jit_compile, warmup)
            info["jit_compile"] = jit_compile
            metadata_path = Path("assets.extra") / "metadata.json"
        else:
            info["signature"] = _write_single_file(exported, staging, format, {
                "model": exported.name, "serving_name": name, "preprocessing": exported.preprocessing})
            metadata_path = Path("metadata.json")
        target = _publish(staging, model_dir, version, info, metadata_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if format == "saved_model":
        write_models_config(export_dir, base_path=base_path, serve={name: int(target.name)} if serve else None)
    return target


def _read_models_config(path):
    """{name: served version} of an existing ``models.config`` (TF Serving's ModelServerConfig text)."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    if not path.exists():
        return {}
    try:
        config = text_format.Parse(path.read_text(), model_server_config_pb2.ModelServerConfig())
    except (text_format.ParseError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a TF Serving model config ({error}): fix or remove it. "
                         f"Received: {path}") from None
    return {entry.name: max(entry.model_version_policy.specific.versions, default=None)
            for entry in config.model_config_list.config}


def write_models_config(export_dir, base_path="/models", serve=None):
    """Rewrites ``models.config``: every SavedModel model under `export_dir`, each serving one version.

    A model keeps the version it served (a version no longer on disk: its
    newest); a model new to the config serves its first version; `serve`
    ({name: version}) moves those models to those versions. The file is
    written with TF Serving's own ModelServerConfig message, under a lock, so
    concurrent exports never lose an entry. Returns the path.
    """
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    export_dir = Path(export_dir)
    path = export_dir / MODELS_CONFIG
    with file_lock(export_dir / f".{MODELS_CONFIG}.lock"):
        served = {**_read_models_config(path), **(serve or {})}
        config = model_server_config_pb2.ModelServerConfig()
        for model_dir in sorted(p for p in export_dir.iterdir() if p.is_dir() and SERVING_NAME.fullmatch(p.name)):
            versions = _versions(model_dir, "saved_model")
            if not versions:
                continue
            entry = config.model_config_list.config.add(name=model_dir.name, base_path=f"{base_path}/{model_dir.name}",
                                                        model_platform="tensorflow")
            version = served.get(model_dir.name, versions[0])  # new to the config: its first version
            entry.model_version_policy.specific.versions.append(version if version in versions else versions[-1])
        write_atomically(path, lambda tmp: tmp.write_text(text_format.MessageToString(config)))
    return path


def served_version(export_dir, name):
    """The version of `name` that ``models.config`` under `export_dir` serves (None if it lists no such model)."""
    return _read_models_config(Path(export_dir) / MODELS_CONFIG).get(name)


def set_served_version(export_dir, name, version, base_path="/models"):
    """Makes ``models.config`` serve `version` of the SavedModel `name` under `export_dir`; returns its path."""
    check_serving_name(name, "name")
    check_version(version)
    if version is None or not (Path(export_dir) / name / str(version) / VERSION_FILES["saved_model"]).exists():
        raise FileNotFoundError(f"{Path(export_dir) / name / str(version)} holds no SavedModel to serve. "
                                f"Received: name={name!r}, version={version!r}")
    return write_models_config(export_dir, base_path=base_path, serve={name: version})


def paper_configurations():
    """Registered full-size names: the paper's rows, the follow-ups and baselines (not the small variants)."""
    from keras_attnconv.models import get_paper_figures, list_models

    return [name for name in list_models() if get_paper_figures(name).source != "ours"]


def export_source(source, export_dir=None, **kwargs):
    """Exports the model of a training run or a preset (`preset_of`), with its metadata; see `export_model`."""
    _check_writable(export_root(export_dir, kwargs.get("format", "saved_model")))  # before loading
    preset = preset_of(source)
    metadata = {**load_preset_metadata(preset), "source": str(preset.resolve()), **(kwargs.pop("metadata", None) or {})}
    return export_model(from_preset(preset), export_dir, metadata=metadata, **kwargs)


def export_registered(name, export_dir=None, **kwargs):
    """Exports the registered configuration `name` with its initial (untrained) weights; see `export_model`."""
    from keras_attnconv.models import build_model, get_model_config

    get_model_config(name)  # an unknown name fails here, before any work
    _check_writable(export_root(export_dir, kwargs.get("format", "saved_model")))
    metadata = {"weights": "initial (untrained): built by build_model, not trained",
                **(kwargs.pop("metadata", None) or {})}
    return export_model(build_model(name, dtype="float32"), export_dir, metadata=metadata, **kwargs)
