"""Invertible 2x2 down-sampling (space-to-depth), as in i-RevNet (Jacobsen et al., 2018)."""

import keras
from keras import ops

from keras_attnconv.layers.validation import grid_size
from keras_attnconv.utils.checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_attnconv")
class InvertibleDownsampling(keras.layers.Layer):
    """Moves each ``block_size x block_size`` patch of pixels into the channels.

    ``(batch, H, W, C) -> (batch, H/b, W/b, b*b*C)`` with the channel order of
    ``tf.nn.space_to_depth`` (channel index ``(row_in_block * b + col_in_block) * C + c``).
    No information is lost: `inverse` undoes it exactly.

    Args:
        block_size: int >= 1, side of the patch (the paper uses 2).

    Call arguments:
        inputs: tensor (batch, H, W, C), H and W static multiples of block_size.

    Returns:
        Tensor (batch, H / block_size, W / block_size, block_size**2 * C).

    Example:
    >>> layer = InvertibleDownsampling(2)
    >>> y = layer(keras.ops.ones((1, 32, 32, 3)))
    >>> keras.ops.shape(y), keras.ops.shape(layer.inverse(y))
    ((1, 16, 16, 12), (1, 32, 32, 3))
    """

    def __init__(self, block_size=2, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("block_size", block_size)
        self.block_size = int(block_size)

    def _check_shape(self, input_shape):
        height, width = grid_size(input_shape)
        if height % self.block_size or width % self.block_size:
            raise ValueError(
                f"Height and width must be multiples of block_size={self.block_size}. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        if input_shape[-1] is None:
            raise ValueError(f"The channel dimension must be known. Received: input_shape={tuple(input_shape)}")
        return height, width, int(input_shape[-1])

    def build(self, input_shape):
        self._check_shape(input_shape)

    def call(self, inputs):
        height, width, channels = self._check_shape(inputs.shape)
        b = self.block_size
        x = ops.reshape(inputs, (-1, height // b, b, width // b, b, channels))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (-1, height // b, width // b, b * b * channels))

    def inverse(self, outputs):
        """Depth-to-space: maps the layer's output back to its input exactly."""
        height, width = grid_size(outputs.shape)
        b = self.block_size
        depth = outputs.shape[-1]
        if depth is None or depth % (b * b):
            raise ValueError(
                f"Channels must be a multiple of block_size**2={b * b}. Received: shape={tuple(outputs.shape)}"
            )
        channels = depth // (b * b)
        x = ops.reshape(outputs, (-1, height, width, b, b, channels))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (-1, height * b, width * b, channels))

    def compute_output_shape(self, input_shape):
        height, width, channels = self._check_shape(input_shape)
        b = self.block_size
        return (input_shape[0], height // b, width // b, b * b * channels)

    def get_config(self):
        return {**super().get_config(), "block_size": self.block_size}
