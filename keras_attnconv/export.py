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

Where each export goes, its version number, and TF Serving's ``models.config``
(merged, never rewritten) are the export root's (`export_root.ExportRoot`):
a version is written under a hidden staging name and renamed onto its number,
never overwritten, and publishing a version does not change the version TF
Serving serves (a model's first version is served when it appears;
`set_served_version`, ``attnconv serve`` or ``attnconv export --serve`` moves it).
"""

import json
import os
import shutil
from pathlib import Path

import keras
import numpy as np

from keras_attnconv.export_root import (
    DEFAULT_EXPORT_DIRS,
    FORMATS,
    METADATA_FILES,
    MODELS_CONFIG,
    VERSION_FILES,
    ExportRoot,
    check_serving_name,
    check_version,
)
from keras_attnconv.presets import check_zoo_model, from_preset, load_preset_metadata, model_metadata
from keras_attnconv.run_directory import preset_of
from keras_attnconv.utils import check_bool

__all__ = ["DEFAULT_EXPORT_DIRS", "FORMATS", "MODELS_CONFIG", "ExportRoot", "check_serving_name", "check_version",
           "export_model", "export_registered", "export_source", "served_version", "set_served_version"]

WARMUP_FILE = "tf_serving_warmup_requests"
WARMUP_BATCH_SIZES = (1, 8)


def float32_copy(model):
    """The model to export: `model` itself in float32, else its float32 copy (same class, config and weights)."""
    return model if model.dtype_policy.name == "float32" else model.with_config(dtype="float32")


def require_tensorflow_backend():
    """Raises RuntimeError unless Keras runs on TensorFlow: every format is traced by TensorFlow."""
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(f"Export traces the model with TensorFlow and needs the TensorFlow backend; Keras runs on "
                           f"{keras.backend.backend()!r}. Run it as KERAS_BACKEND=tensorflow attnconv export ...")


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
        for key, value in (("keras_attnconv", json.dumps(description, allow_nan=False)),
                           ("class_names", json.dumps(list(model.class_names), allow_nan=False))):
            proto.metadata_props.add(key=key, value=value)
        onnx.checker.check_model(proto)
        onnx.save(proto, str(path))
    return {"inputs": {"images": ["uint8", [None, size, size, 3]]},
            "outputs": {"logits": ["float32", [None, model.config.num_classes]]}}


def _load_saved_model(path):
    import tensorflow as tf

    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    return lambda images: served(images=tf.constant(images))["probabilities"].numpy()


def _load_onnx(path):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path / VERSION_FILES["onnx"]), providers=["CPUExecutionProvider"])
    return lambda images: session.run(["logits"], {"images": images})[0]


def _load_litert(path):
    from ai_edge_litert.interpreter import Interpreter

    interpreters = {}  # one per batch size: resizing reallocates every tensor

    def run(images):
        if len(images) not in interpreters:
            interpreter = Interpreter(str(path / VERSION_FILES["litert"]), num_threads=os.cpu_count())
            index = interpreter.get_input_details()[0]["index"]
            interpreter.resize_tensor_input(index, images.shape)
            interpreter.allocate_tensors()
            interpreters[len(images)] = (interpreter, index, interpreter.get_output_details()[0]["index"])
        interpreter, index, output = interpreters[len(images)]
        interpreter.set_tensor(index, images)
        interpreter.invoke()
        return interpreter.get_tensor(output)

    return run


#: Each format's runtime: the module that must be installed to run it, and the loader of a version directory.
RUNTIMES = {"saved_model": ("tensorflow", _load_saved_model), "onnx": ("onnxruntime", _load_onnx),
            "litert": ("ai_edge_litert", _load_litert)}


def load_in_runtime(format, version_dir):
    """The export in `version_dir`, loaded in its format's runtime: a function of a uint8 batch of images.

    It returns the probabilities for a SavedModel (its ``serving_default``), the
    logits for ONNX and LiteRT (the files' own output).
    """
    return RUNTIMES[format][1](Path(version_dir))


def _check_in_runtime(model, staging, format, name):
    """Raises RuntimeError unless the export in `staging` loads and runs one batch in its runtime (if installed).

    A converter can write a file its own runtime refuses (LiteRT on the
    smallest grids): such a file must never be published.
    """
    module, _ = RUNTIMES[format]
    try:
        __import__(module)
    except ImportError:  # the format was written without its runtime: nothing to check it with here
        return
    size, classes = model.config.image_size, model.config.num_classes
    images = np.random.default_rng(0).integers(0, 256, (2, size, size, 3), dtype=np.uint8)
    try:
        shape = tuple(np.shape(load_in_runtime(format, staging)(images)))
        if shape != (2, classes):
            raise ValueError(f"it returned shape {shape} for (2, {classes})")
    except Exception as error:  # the runtime's own errors: the reason, on one line
        reason = " ".join(str(error).split()) or type(error).__name__
        raise RuntimeError(f"The {format} export of {name} cannot be run by {module} ({reason}); nothing was "
                           f"published. Export another format. Received: format={format!r}") from None


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
        RuntimeError: the exported file cannot be loaded, or run on one
            batch, by its runtime (checked where it is installed); nothing
            is published.
    """
    check_zoo_model(model)
    root = ExportRoot(export_dir, format)
    name = check_serving_name(serving_name) if serving_name is not None else check_serving_name(model.name, "name")
    for flag, value in (("serve", serve), ("jit_compile", jit_compile), ("warmup", warmup)):
        check_bool(flag, value)
    if format != "saved_model" and (serve or jit_compile):
        raise ValueError(f"`serve` and `jit_compile` apply to SavedModels. Received: format={format!r}")
    require_tensorflow_backend()
    root.check(name)
    root.check_new_version(name, version)  # fail before the work; rechecked at publication
    json.dumps(metadata, allow_nan=False)  # not JSON (a type, a NaN): an error before the work

    exported = float32_copy(model)
    root.claim()
    staging = root.new_staging(name)
    info = {**(metadata or {}), **model_metadata(exported), "config": exported.get_config(), "serving_name": name,
            "format": format, "version": None}

    def write_metadata(directory, number):
        info["version"] = number
        (directory / METADATA_FILES[format]).write_text(json.dumps(info, indent=2, allow_nan=False) + "\n")

    try:
        if format == "saved_model":
            info["signature"] = _write_saved_model(exported, staging, name, jit_compile, warmup)
            info["jit_compile"] = jit_compile
        else:
            info["signature"] = _write_single_file(exported, staging, format, {
                "model": exported.name, "serving_name": name, "preprocessing": exported.preprocessing})
        _check_in_runtime(exported, staging, format, name)
        target = root.publish(staging, name, version, write_metadata)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if format == "saved_model":
        root.update_models_config(base_path=base_path, serve={name: int(target.name)} if serve else None)
    return target


def served_version(export_dir, name):
    """The version of `name` that ``models.config`` under `export_dir` serves (None if it lists no such model)."""
    return ExportRoot(export_dir).served_version(name)


def set_served_version(export_dir, name, version, base_path="/models"):
    """Makes ``models.config`` serve `version` of the SavedModel `name` under `export_dir`; returns its path.

    Every other entry and field of ``models.config`` stays as it was.
    """
    root = ExportRoot(export_dir)
    check_serving_name(name, "name")
    check_version(version, allow_none=False)
    root.check()
    return root.update_models_config(base_path=base_path, serve={name: version})


def paper_configurations():
    """Registered full-size names: the paper's rows, the follow-ups and baselines (not the small variants)."""
    from keras_attnconv.models import get_paper_figures, list_models

    return [name for name in list_models() if get_paper_figures(name).source != "ours"]


def export_source(source, export_dir=None, **kwargs):
    """Exports the model of a training run or a preset (`preset_of`), with its metadata; see `export_model`."""
    root = ExportRoot(export_dir, kwargs.get("format", "saved_model"))
    root.check()  # before loading
    preset = preset_of(source)
    # Seen from the export root: an absolute path of this machine would mean nothing where the export is served.
    metadata = {**load_preset_metadata(preset), "source": os.path.relpath(preset.resolve(), root.path.resolve()),
                **(kwargs.pop("metadata", None) or {})}
    return export_model(from_preset(preset), export_dir, metadata=metadata, **kwargs)


def export_registered(name, export_dir=None, **kwargs):
    """Exports the registered configuration `name` with its initial (untrained) weights; see `export_model`."""
    from keras_attnconv.models import build_model, get_model_config

    get_model_config(name)  # an unknown name fails here, before any work
    ExportRoot(export_dir, kwargs.get("format", "saved_model")).check()
    metadata = {"weights": "initial (untrained): built by build_model, not trained",
                **(kwargs.pop("metadata", None) or {})}
    return export_model(build_model(name, dtype="float32"), export_dir, metadata=metadata, **kwargs)
