"""What a zoo model takes: one uint8 RGB batch of the size it was built for, checked wherever images enter.

The model checks its input when it is called (`check_images`). A generator's
or a `keras.utils.PyDataset`'s batches are checked too, as they are made
(`checked_python_batches`): on TensorFlow, Keras turns them into a tf.data
pipeline whose signature is its first batches', and a later batch of another
dtype is cast to it silently (float pixels in [0, 1] become uint8 zeros), so
the model never sees the float images it would refuse. On JAX each batch
reaches the model as it was made.
"""

import functools
import types

import keras


def _only_shapes():
    """Whether Keras is computing output shapes only (``compute_output_spec``).

    There the input's dtype need not be the data's: under tf.distribute, Keras
    builds the model from the replicas' first batches averaged, as floats.
    """
    try:
        from keras.src.backend.common.symbolic_scope import in_symbolic_scope
    except ImportError:  # another Keras layout: check always
        return False
    return in_symbolic_scope()


def _describe(inputs):
    """What a model was called on, in a few words: a type and shapes, never the values."""
    if isinstance(inputs, (list, tuple, dict)):
        shapes = [tuple(x.shape) if hasattr(x, "shape") else type(x).__name__ for x in keras.tree.flatten(inputs)]
        shown = ", ".join(map(str, shapes[:3])) + (", ..." if len(shapes) > 3 else "")
        return f"a {type(inputs).__name__} of {len(shapes)} items ({shown})"
    return f"an array of shape {tuple(inputs.shape)}" if hasattr(inputs, "shape") else repr(inputs)[:80]


def check_images(model_in_words, size, inputs):
    """Raises a ValueError unless `inputs` is one uint8 batch (batch, size, size, 3).

    Args:
        model_in_words: the model in words, for the messages: its class and name.
        size: the image size the model was built for.
        inputs: what the model was given.
    """
    flat = keras.tree.flatten(inputs)
    if len(flat) != 1 or len(getattr(flat[0], "shape", ())) != 4:
        raise ValueError(
            f"{model_in_words} takes one uint8 array of images (batch, {size}, {size}, 3); stack a list of images "
            f"first (np.stack). Received: images={_describe(inputs)}"
        )
    (images,) = flat
    if images.shape[-1] is not None and images.shape[-1] != 3:  # a grayscale batch would be broadcast
        raise ValueError(
            f"{model_in_words} takes RGB images, 3 channels last (batch, {size}, {size}, 3). "
            f"Received: images of shape {tuple(images.shape)}, {images.shape[-1]} channels"
        )
    if tuple(images.shape[1:3]) != (size, size):
        # Keras' input check catches this in `__call__` but not in `fit`/`predict` on JAX, which call `call`:
        # there the attention layers would take the other grid and the model answer for images it never saw.
        # An unknown size is a generator's batches of several sizes, traced by TensorFlow as one.
        unknown = " (not known when traced: batches of several sizes?)" if None in images.shape[1:3] else ""
        raise ValueError(
            f"{model_in_words} takes {size}x{size} images, the size it was built for (batch, {size}, {size}, 3). "
            "Resize them first (keras.ops.image.resize), or build a model for their size "
            f"(build_model(name, image_size=...)). Received: images of shape {tuple(images.shape)}{unknown}"
        )
    if _only_shapes():  # the shapes are the data's (Keras' build in `fit` checks them here), the dtype may not be
        return
    dtype = keras.backend.standardize_dtype(images.dtype) if hasattr(images, "dtype") else type(images).__name__
    if dtype != "uint8":
        raise ValueError(
            f"{model_in_words} takes uint8 images, the raw pixels: it normalises them itself. Pass the pixels before "
            "any scaling (e.g. keras.ops.cast(images, 'uint8') for float pixels in [0, 255]). "
            f"Received: images of dtype {dtype}"
        )


def _checked(check, batch):
    inputs, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    check(inputs)
    return batch


class _CheckedPyDataset(keras.utils.PyDataset):
    """A user's `PyDataset`, each batch checked as it is made; its workers, length and epoch hooks its own."""

    def __init__(self, dataset, check):
        super().__init__(
            workers=dataset.workers,
            use_multiprocessing=dataset.use_multiprocessing,
            max_queue_size=dataset.max_queue_size,
        )
        self.dataset = dataset
        self.check = check

    @property
    def num_batches(self):
        return self.dataset.num_batches

    def __getitem__(self, index):
        return _checked(self.check, self.dataset[index])

    def on_epoch_begin(self):
        self.dataset.on_epoch_begin()

    def on_epoch_end(self):
        self.dataset.on_epoch_end()


def checked_python_batches(data, model_in_words, size):
    """`data` with each batch's images checked (`check_images`) as it is made, where Keras would cast them.

    That is a generator or a `keras.utils.PyDataset` on TensorFlow (see the
    module); any other data is returned as it is.
    """
    if keras.backend.backend() != "tensorflow":
        return data
    check = functools.partial(check_images, model_in_words, size)  # a module's function: a worker process can take it
    if isinstance(data, keras.utils.PyDataset):
        return _CheckedPyDataset(data, check)
    if isinstance(data, types.GeneratorType):
        return (_checked(check, batch) for batch in data)
    return data
