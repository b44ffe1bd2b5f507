"""The preprocessing inside every model of the zoo: raw uint8 pixels -> per-channel normalised floats."""

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.validation import real_inputs
from keras_attnconv.utils.checks import check_real

_FLOAT32_MAX = float(np.finfo("float32").max)


def check_channel_statistics(name, values, positive=False):
    """`values` as a tuple of 3 Python floats (one per RGB channel), or ValueError naming `name`."""
    try:
        values = tuple(values)
    except TypeError:
        values = None
    if values is None or len(values) != 3:
        raise ValueError(f"`{name}` must hold one number per RGB channel (3). Received: {name}={values!r}")
    for value in values:
        check_real(name, value, low=0.0, low_open=True) if positive else check_real(name, value)
    return tuple(float(v) for v in values)


def check_normalization(mean, std, names=("mean", "std")):
    """`(mean, std)` checked (`check_channel_statistics`), or ValueError naming the argument float32 cannot hold.

    The layer computes ``pixels / (255 std) - mean / std`` in float32: a value
    that rounds to 0 or overflows there (``std=1e-50``, ``mean=1e39``) would
    make the model compute something else, silently.
    """
    mean = check_channel_statistics(names[0], mean)
    std = check_channel_statistics(names[1], std, positive=True)
    computed = (
        (names[0], mean),
        (names[1], [1.0 / s for s in std]),
        (f"{names[0]} / {names[1]}", [m / s for m, s in zip(mean, std)]),
    )
    for name, values in computed:
        if not all(abs(v) <= _FLOAT32_MAX for v in values):
            raise ValueError(
                f"`{name}` must be a number float32 can hold (up to {_FLOAT32_MAX:.3g}), as the model "
                f"normalises in float32. Received: {names[0]}={mean}, {names[1]}={std}"
            )
    return mean, std


@keras.saving.register_keras_serializable(package="keras_attnconv")
class PixelNormalization(keras.layers.Layer):
    """``(pixels / 255 - mean) / std`` per channel, in float32 under any dtype policy.

    The first layer of every model of the zoo, so that a model (and each of
    its exports) takes the raw pixels and carries its own statistics.

    Args:
        mean: per-channel mean of the pixels scaled to [0, 1] (3 numbers).
        std: per-channel standard deviation of the pixels scaled to [0, 1]
            (3 numbers > 0).

    Call arguments:
        inputs: tensor (..., 3) of pixel values in [0, 255], uint8 in the zoo's models.

    Returns:
        Tensor of the input's shape in the layer's compute dtype (float32
        unless a `dtype` is given).

    Example:
    >>> layer = PixelNormalization(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    >>> pixels = keras.ops.full((1, 2, 2, 3), 255, "uint8")
    >>> keras.ops.convert_to_numpy(layer(pixels)[0, 0, 0])  # (1 - 0.5) / 0.25
    array([2., 2., 2.], dtype=float32)
    """

    def __init__(self, mean, std, **kwargs):
        kwargs.setdefault("dtype", "float32")  # exact statistics under any policy; the next layer casts
        super().__init__(**kwargs)
        self.mean, self.std = check_normalization(mean, std)

    def call(self, inputs):
        scale = ops.convert_to_tensor([1.0 / (255.0 * s) for s in self.std], "float32")
        offset = ops.convert_to_tensor([m / s for m, s in zip(self.mean, self.std)], "float32")
        return ops.cast(real_inputs(inputs, "float32") * scale - offset, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "mean": list(self.mean), "std": list(self.std)}
