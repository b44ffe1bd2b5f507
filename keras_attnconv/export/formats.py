"""The format writers: a SavedModel with TF Serving's warm-up requests, ONNX and LiteRT files."""

import json
import warnings

import keras
import numpy as np

from keras_attnconv.export.root import VERSION_FILES

# What an export computes in -> the dtype policy of the model it traces. bfloat16 keeps float32 weights, scores,
# softmax and logits (the mixed policy's rules), so the signature's inputs and outputs are those of float32.
COMPUTE_DTYPES = {"float32": "float32", "bfloat16": "mixed_bfloat16"}


def serving_copy(model, compute_dtype="float32"):
    """The model to export: `model` itself if its policy computes in `compute_dtype`, else its copy in that
    policy (same class, config and weights)."""
    policy = COMPUTE_DTYPES[compute_dtype]
    return model if model.dtype_policy.name == policy else model.with_config(dtype=policy)


def require_tensorflow_backend():
    """Raises RuntimeError unless Keras runs on TensorFlow: every format is traced by TensorFlow."""
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            f"Export traces the model with TensorFlow and needs the TensorFlow backend; Keras runs on "
            f"{keras.backend.backend()!r}. Run it as KERAS_BACKEND=tensorflow attnconv export ..."
        )


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
                model_spec=model_pb2.ModelSpec(name=serving_name, signature_name="serving_default")
            )
            images = rng.integers(0, 256, (batch, *image_shape), dtype=np.uint8)
            request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path


def write_saved_model(model, staging, serving_name, jit_compile, warmup):
    import tensorflow as tf

    image_shape = tuple(int(d) for d in model.input_shape[1:])
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serving_default",
        _serving_function(model),
        input_signature=[tf.TensorSpec((None, *image_shape), tf.uint8, name="images")],
        jit_compile=jit_compile,
    )
    archive.write_out(str(staging), verbose=False)
    if warmup:
        _write_warmup(staging, serving_name, image_shape)
    (staging / "assets.extra").mkdir(exist_ok=True)
    return {
        "inputs": {"images": ["uint8", [None, *image_shape]]},
        "outputs": {
            "probabilities": ["float32", [None, model.config.num_classes]],
            "classes": ["int64", [None]],
            "class_names": ["string", [None]],
        },
    }


def _needs(module, format):
    try:
        __import__(module)
    except ImportError:
        raise ModuleNotFoundError(
            f"The {format} export needs {module}: pip install 'keras-attnconv[export]'. Received: format={format!r}"
        ) from None


def write_single_file(model, staging, format, description):
    """ONNX and LiteRT: Keras' own export of the model (uint8 images -> logits)."""
    if format == "onnx":
        _needs("tf2onnx", format)
    import tensorflow as tf

    size = model.config.image_size
    path = staging / VERSION_FILES[format]
    # The signature given, not taken from the model: Keras' own needs a model that has been called once.
    signature = [tf.TensorSpec((None, size, size, 3), tf.uint8, name="images")]
    if format == "litert":
        path.write_bytes(_litert_file(model, signature, staging))
    else:
        with warnings.catch_warnings():
            # Keras' ONNX export probes `np.object`, which NumPy 2 answers with a FutureWarning meant for Keras.
            warnings.filterwarnings("ignore", message="In the future `np.object`", category=FutureWarning)
            model.export(str(path), format=format, verbose=False, input_signature=signature)
    if format == "onnx":
        import onnx

        proto = onnx.load(str(path))
        # The output named for what it is (tf2onnx names it after the traced graph's "Identity:0").
        proto.graph.node.append(onnx.helper.make_node("Identity", [proto.graph.output[0].name], ["logits"]))
        proto.graph.output[0].name = "logits"
        # The file says what it is, as the SavedModel's metadata.json does.
        for key, value in (
            ("keras_attnconv", json.dumps(description, allow_nan=False)),
            ("class_names", json.dumps(list(model.class_names), allow_nan=False)),
        ):
            proto.metadata_props.add(key=key, value=value)
        onnx.checker.check_model(proto)
        onnx.save(proto, str(path))
    return {
        "inputs": {"images": ["uint8", [None, size, size, 3]]},
        "outputs": {"logits": ["float32", [None, model.config.num_classes]]},
    }


def _litert_file(model, signature, staging):
    """The LiteRT file: Keras' own conversion path (an export archive, then TensorFlow's converter from it), with
    the signature's output named ``logits``, as in the ONNX file and metadata.json (Keras' ``model.export`` names
    it ``output_0``, which is what a LiteRT signature runner's user would have had to ask for)."""
    import shutil

    import tensorflow as tf

    # The converter's input lives in the staging directory, not in the system's temporary folder: nothing is
    # written outside the export root, and it is gone before the version is published.
    saved_model_dir = staging / "litert_saved_model"
    try:
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint(
            "serve", lambda images: {"logits": model(images, training=False)}, input_signature=signature
        )
        archive.write_out(str(saved_model_dir), verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model_dir))
        # As Keras converts: TensorFlow ops the builtins lack are allowed (the interpreter's check before
        # publishing refuses a file it cannot run), and the model's variables stay resources.
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
        converter.experimental_enable_resource_variables = True
        return converter.convert()
    finally:
        shutil.rmtree(saved_model_dir, ignore_errors=True)


WARMUP_FILE = "tf_serving_warmup_requests"


WARMUP_BATCH_SIZES = (1, 8)
