"""Absolute position encodings over an image grid, the baselines of the relative ones.

Both layers return the encoding only, shaped like their input, as Keras'
own position-embedding layers do; the model adds it to the tokens
(``x + encoding(x)``) before the first encoder block.
"""

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.validation import get_initializer, grid_size
from keras_attnconv.utils.checks import check_real


@keras.saving.register_keras_serializable(package="keras_attnconv")
class LearnedPositionEmbedding(keras.layers.Layer):
    """A learned table of shape (height, width, channels), one vector per pixel.

    Args:
        initializer: initializer of the table (default N(0, 0.02^2), as BERT).

    Call arguments:
        inputs: (batch, H, W, C); only its static shape is used.

    Returns:
        The table broadcast to the input's shape, in the compute dtype (also
        for integer inputs).

    Example:
    >>> x = keras.ops.zeros((2, 16, 16, 64))
    >>> keras.ops.shape(x + LearnedPositionEmbedding()(x))
    (2, 16, 16, 64)
    """

    def __init__(self, initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.initializer = get_initializer("initializer", initializer or keras.initializers.RandomNormal(stddev=0.02))

    def build(self, input_shape):
        height, width = grid_size(input_shape)
        if input_shape[-1] is None:
            raise ValueError(f"The channel dimension must be known. Received: input_shape={tuple(input_shape)}")
        self.table = self.add_weight(name="table", shape=(height, width, input_shape[-1]), initializer=self.initializer)

    def call(self, inputs):
        if tuple(inputs.shape[1:]) != tuple(self.table.shape):
            raise ValueError(
                f"The table was built for {tuple(self.table.shape)} grids. Received: input_shape={tuple(inputs.shape)}"
            )
        return ops.broadcast_to(ops.cast(self.table, self.compute_dtype)[None], ops.shape(inputs))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "initializer": keras.initializers.serialize(self.initializer)}


def sinusoid_table(height, width, channels, max_wavelength=10_000.0):
    """2-D sinusoids: the first half of the channels encodes the row, the second half the column.

    Each half is the Transformer encoding of Vaswani et al. (2017):
    ``sin(p / max_wavelength^(2i/d))`` and ``cos(...)`` interleaved over ``d = channels / 2``.
    """
    if channels % 4:
        raise ValueError(f"2-D sinusoids need channels divisible by 4. Received: channels={channels}")
    half = channels // 2
    frequencies = max_wavelength ** (-np.arange(0, half, 2, dtype="float64") / half)

    def encode(length):
        angles = np.arange(length, dtype="float64")[:, None] * frequencies[None, :]
        table = np.empty((length, half))
        table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
        return table

    rows = np.broadcast_to(encode(height)[:, None, :], (height, width, half))
    cols = np.broadcast_to(encode(width)[None, :, :], (height, width, half))
    return np.concatenate([rows, cols], axis=-1).astype("float32")


@keras.saving.register_keras_serializable(package="keras_attnconv")
class SinusoidalPositionEmbedding(keras.layers.Layer):
    """Fixed 2-D sinusoidal position encoding (`sinusoid_table`); no weights.

    Args:
        max_wavelength: float, the longest wavelength of the sinusoids.

    Call arguments:
        inputs: (batch, H, W, C) with C divisible by 4; only its shape is used.

    Returns:
        The encoding broadcast to the input's shape, in the compute dtype (also
        for integer inputs).
    """

    def __init__(self, max_wavelength=10_000.0, **kwargs):
        super().__init__(**kwargs)
        check_real("max_wavelength", max_wavelength, low=1.0, low_open=True)
        self.max_wavelength = float(max_wavelength)

    def build(self, input_shape):
        height, width = grid_size(input_shape)
        sinusoid_table(height, width, input_shape[-1] or 0, self.max_wavelength)  # validates channels

    def call(self, inputs):
        height, width = grid_size(inputs.shape)
        table = sinusoid_table(height, width, inputs.shape[-1], self.max_wavelength)
        return ops.broadcast_to(ops.cast(table, self.compute_dtype)[None], ops.shape(inputs))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "max_wavelength": self.max_wavelength}
