"""PyTorch's default initialisation of a linear layer, as a Keras initializer (the official code keeps it)."""

import math

import keras

from keras_attnconv.layers.validation import independent
from keras_attnconv.utils.checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_attnconv")
class FanInUniform(keras.initializers.RandomUniform):
    """``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``: what ``torch.nn.Linear`` draws its weight and its bias from.

    (``kaiming_uniform_`` with ``a = sqrt(5)`` for the weight gives exactly this bound, and the
    bias uses it too.) The official code of the paper applies no initialisation of its own, so
    every linear layer of its models starts this way.

    Args:
        fan_in: the inputs of the product the weight takes part in; None means the product
            of all but the last dimension, as PyTorch counts it for a kernel (a Dense kernel
            ``(inputs, units)``: inputs; a convolution's ``(kh, kw, in, out)``: ``kh kw in``).
            Weights whose shape does not show it (a bias, a per-head kernel) get it from their
            layer through `initializer_for`.
        seed: as for Keras' initializers.

    Example:
    >>> dense = keras.layers.Dense(4, kernel_initializer=FanInUniform(), bias_initializer=FanInUniform(16))
    >>> dense.build((None, 16))  # kernel (16, 4) and bias (4,), both U(-1/4, 1/4): fan-in 16
    >>> [bool(keras.ops.max(keras.ops.abs(w)) <= 0.25) for w in (dense.kernel, dense.bias)]
    [True, True]
    """

    def __init__(self, fan_in=None, seed=None):
        if fan_in is not None:
            check_positive_int("fan_in", fan_in)
        self.fan_in = None if fan_in is None else int(fan_in)
        super().__init__(seed=seed)

    def __call__(self, shape, dtype=None):
        fan_in = self.fan_in or (math.prod(shape[:-1]) if len(shape) >= 2 else 0)
        if not fan_in:
            raise ValueError(
                "FanInUniform needs a `fan_in` for a weight whose shape does not show one (a bias, "
                f"a scalar, an empty dimension). Received: shape={tuple(shape)}, fan_in={self.fan_in}"
            )
        bound = 1.0 / math.sqrt(fan_in)
        return keras.random.uniform(shape, -bound, bound, dtype=dtype, seed=self.seed)

    def get_config(self):
        return {"fan_in": self.fan_in, "seed": super().get_config()["seed"]}


def initializer_for(initializer, fan_in):
    """The initializer of one more weight with `fan_in` inputs: a `FanInUniform` takes that fan-in,
    and every unseeded initializer becomes an independent copy (`independent`)."""
    if isinstance(initializer, FanInUniform):
        return type(initializer).from_config({**initializer.get_config(), "fan_in": fan_in})
    return independent(initializer)
