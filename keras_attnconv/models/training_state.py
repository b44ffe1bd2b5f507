"""The optimizer's and the metrics' variables, created before TensorFlow traces a training step that would.

Without tf.distribute, Keras' TensorFlow trainer defers building the optimizer,
the loss and the metrics to the first trace of the train function. A
`tf.function` whose first trace creates variables is traced a second time,
without them: so every `fit` (and `train_on_batch`) on TensorFlow traced its
training step twice.
Measured on a 2-core AMD EPYC (AVX-512 BF16), a tiny `attnconv` run took
8.0 -> 6.9 s with XLA and 3.3 -> 3.1 s in a graph. Keras builds them ahead
itself under a distribution strategy (and always on JAX), from the symbolic
shapes of one batch: so does `build_training_state`, for the inputs whose
batch shapes are known without reading them.
"""

import keras
import numpy as np


def _batch_spec(x, y):
    """The symbolic (x, y) of one batch where `x` and `y` tell it without reading data, else None."""
    import tensorflow as tf  # the backend in use: `build_training_state` runs on TensorFlow only

    if isinstance(x, tf.data.Dataset):  # of (images, labels[, sample weights]) batches
        spec = x.element_spec
        return spec if y is None and isinstance(spec, tuple) and len(spec) >= 2 else None
    if all(isinstance(a, (np.ndarray, tf.Tensor)) for a in (x, y)):
        return tuple(keras.KerasTensor((None, *a.shape[1:]), keras.backend.standardize_dtype(a.dtype)) for a in (x, y))
    return None


def build_training_state(model, x, y=None):
    """Creates `model`'s optimizer, loss and metric variables before its first step is traced (TensorFlow only).

    A no-op where Keras builds them itself (JAX, tf.distribute), where they
    exist already, or where the batch's shapes are not known from `x` and
    `y` alone (a generator, a `PyDataset`): there Keras' deferred build stands.
    """
    if keras.backend.backend() != "tensorflow" or getattr(model, "_distribute_strategy", None) is not None:
        return
    if not model.compiled or not hasattr(model, "_symbolic_build"):  # Keras' own ahead-of-trace build
        return
    batch = _batch_spec(x, y)
    if batch is not None:
        model._symbolic_build(data_batch=batch)
