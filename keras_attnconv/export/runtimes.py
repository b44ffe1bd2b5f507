"""Each export format's runtime (TensorFlow, onnxruntime, LiteRT): loads an export and checks it against the model."""

import os
import sys
from pathlib import Path

import numpy as np

from keras_attnconv.export.root import VERSION_FILES


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
RUNTIMES = {
    "saved_model": ("tensorflow", _load_saved_model),
    "onnx": ("onnxruntime", _load_onnx),
    "litert": ("ai_edge_litert", _load_litert),
}


def load_in_runtime(format, version_dir):
    """The export in `version_dir`, loaded in its format's runtime: a function of a uint8 batch of images.

    It returns the probabilities for a SavedModel (its ``serving_default``), the
    logits for ONNX and LiteRT (the files' own output).
    """
    return RUNTIMES[format][1](Path(version_dir))


def check_in_runtime(model, staging, format, name):
    """Raises RuntimeError unless the export in `staging` loads and runs one batch in its runtime.

    Where the runtime is not installed (LiteRT's converter is TensorFlow's, its interpreter the ``export``
    extra's), the export is published unchecked, and a line on stderr says so.

    A converter can write a file its own runtime refuses (LiteRT did on the
    smallest grids until position-only heads became one batched matmul): such a file must never be
    published.
    """
    module, _ = RUNTIMES[format]
    try:
        __import__(module)
    except ImportError:  # the format was written without its runtime: nothing to check it with here, said so
        print(
            f"The {format} export of {name} was not run before it was published: {module} is not installed "
            f"(pip install 'keras-attnconv[export]').",
            file=sys.stderr,
        )
        return
    size, classes = model.config.image_size, model.config.num_classes
    images = np.random.default_rng(0).integers(0, 256, (2, size, size, 3), dtype=np.uint8)
    try:
        shape = tuple(np.shape(load_in_runtime(format, staging)(images)))
        if shape != (2, classes):
            raise ValueError(f"it returned shape {shape} for (2, {classes})")
    except Exception as error:  # the runtime's own errors: the reason, on one line
        reason = " ".join(str(error).split()) or type(error).__name__
        raise RuntimeError(
            f"The {format} export of {name} cannot be run by {module} ({reason}); nothing was "
            f"published. Export another format. Received: format={format!r}"
        ) from None
