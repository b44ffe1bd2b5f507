"""The first half of test-time flips: at inference, a batch of images followed by their mirror images."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_attnconv")
class MirroredBatch(keras.layers.Layer):
    """At inference, the images followed by the same images mirrored left to right; in training, the images.

    A classifier placed between this layer and `MirrorAverage` classifies
    each image and its mirror image at inference and outputs the mean of the
    two (test-time flips), while training sees each image once. The
    classifier in between must treat the images of a batch independently at
    inference (batch normalisation with its moving statistics, attention
    within an image), as the zoo's models do.

    Call arguments:
        inputs: images (batch, height, width, channels), any dtype.
        training: whether the call is a training step (False, the default,
            at inference).

    Returns:
        At inference (2 * batch, height, width, channels): `inputs`, then
        `inputs` with the width axis reversed. In training, `inputs`.

    Example:
    >>> images = np.arange(4, dtype="uint8").reshape(1, 1, 4, 1)
    >>> keras.ops.convert_to_numpy(MirroredBatch()(images))[:, 0, :, 0]
    array([[0, 1, 2, 3],
           [3, 2, 1, 0]], dtype=uint8)
    """

    def call(self, inputs, training=False):
        if len(inputs.shape) != 4:
            raise ValueError(
                f"`MirroredBatch` takes images (batch, height, width, channels). "
                f"Received: inputs of shape {tuple(inputs.shape)}"
            )
        if training:
            return inputs
        return ops.concatenate([inputs, ops.flip(inputs, axis=2)], axis=0)

    def compute_output_spec(self, inputs, training=False):
        # The inference shape, which a model's graph is built with (the batch is unknown there: None), and the
        # images' own dtype (uint8 in the zoo's models), which no cast changes.
        batch = inputs.shape[0]
        shape = inputs.shape if training else (None if batch is None else 2 * batch, *inputs.shape[1:])
        return keras.KerasTensor(shape, dtype=inputs.dtype)
