"""Theorem 1 as code: turn a convolution into self-attention that computes the same function.

A K x K convolution is a sum over the K^2 kernel taps of ``W_tap x[q + shift_tap]``.
With one position-only quadratic head per tap, centered on that tap's shift with
a large ``alpha``, each head attends to exactly one pixel (Lemma 2), and the
merged value/output kernel of head ``tap`` is ``W_tap`` (Lemma 1). Zero padding,
strides and the output window are handled around the attention: the input is
zero-padded so that every tap lands on a real (possibly zero) pixel, and the
output is read at the strided anchor positions.
"""

import dataclasses

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers import ConvolutionAsAttention, QuadraticScore, RelativeMultiHeadAttention
from keras_attnconv.layers.validation import check_tensor_bytes
from keras_attnconv.utils.checks import check_choice, check_positive_int, check_real, check_seed

#: Softmax weight of a pixel one step from a head's center is exp(-alpha):
#: exp(-100) ~ 4e-44 is below float32 resolution next to 1 (Lemma 2 needs >= 46).
CONVERSION_ALPHA = 100.0


def conv_to_attention(conv, alpha=CONVERSION_ALPHA):
    """Returns a layer of self-attention that computes what `conv` computes (Theorem 1).

    Args:
        conv: a built `keras.layers.Conv2D` or `keras.layers.Conv1D` with
            ``padding`` "same" or "valid", ``channels_last``, ``groups=1``.
        alpha: the quadratic encoding's sharpness, a positive number float32
            can hold (default 100, hard in float32).

    Returns:
        A `ConvolutionAsAttention` layer: ``conv.kernel_size`` product heads,
        centers on the (dilated) kernel grid, value/output kernel and bias
        from the convolution. Its ``.attention`` is the position-only quadratic
        `RelativeMultiHeadAttention`.

    Example:
    >>> conv = keras.layers.Conv2D(8, 3, padding="same")
    >>> conv.build((None, 16, 16, 4))
    >>> layer = conv_to_attention(conv)
    >>> layer.attention.num_heads
    9
    """
    # alpha scales float32 scores: beyond float32's range it would be inf, and inf * 0 (a head's center) NaN.
    check_real("alpha", alpha, low=0.0, high=float(np.finfo("float32").max), low_open=True)
    if not isinstance(conv, (keras.layers.Conv1D, keras.layers.Conv2D)) or isinstance(
        conv, (keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose)
    ):
        raise ValueError(f"`conv` must be a Conv1D or Conv2D layer. Received: conv={conv!r}")
    if not conv.built:
        raise ValueError(f"`conv` must be built (its kernel must exist). Received: conv={conv.name} (not built)")
    if conv.groups != 1:
        raise ValueError(f"Grouped convolutions are not supported. Received: groups={conv.groups}")
    if conv.data_format != "channels_last":
        raise ValueError(f"Only channels_last is supported. Received: data_format={conv.data_format!r}")
    if conv.padding not in ("same", "valid"):
        raise ValueError(f"Only 'same' and 'valid' padding are supported. Received: padding={conv.padding!r}")
    if conv.activation not in (None, keras.activations.linear):
        raise ValueError(
            "The convolution must be linear (apply its activation after the attention). "
            f"Received: activation={keras.activations.serialize(conv.activation)!r}"
        )

    kernel = ops.convert_to_numpy(conv.kernel)
    kernel = kernel[None] if kernel.ndim == 3 else kernel  # Conv1D as a 1 x K convolution
    kernel_h, kernel_w, channels_in, channels_out = kernel.shape
    dilation = (1, *conv.dilation_rate) if len(conv.dilation_rate) == 1 else conv.dilation_rate
    taps = [(i, j) for i in range(kernel_h) for j in range(kernel_w)]
    centers = np.array([(i * dilation[0], j * dilation[1]) for i, j in taps], "float32")

    score = QuadraticScore(len(taps), dtype="float32")
    attention = RelativeMultiHeadAttention(
        num_heads=len(taps),
        output_dim=channels_out,
        position_score=score,
        use_bias=conv.use_bias,
        dropout=0.0,
        dtype=conv.dtype_policy,
    )
    layer = ConvolutionAsAttention(
        attention,
        conv.kernel_size,
        conv.strides,
        conv.dilation_rate,
        conv.padding,
        dtype=conv.dtype_policy,
        name=f"{conv.name}_as_attention",
    )
    attention.build((None, kernel_h * dilation[0] + 1, kernel_w * dilation[1] + 1, channels_in))
    score.centers.assign(centers)
    score.set_alpha(np.full(len(taps), alpha, "float32"))
    attention.output_kernel.assign(np.stack([kernel[i, j] for i, j in taps]))
    if conv.use_bias:
        attention.output_bias.assign(ops.convert_to_numpy(conv.bias))
    return layer


@dataclasses.dataclass(frozen=True)
class ConversionMeasurement:
    """How far a converted convolution's output is from the convolution's (see `measure_conversion`)."""

    num_heads: int
    output_shape: tuple
    max_abs_error: float
    relative_error: float  # max abs error / max abs output of the convolution


def measure_conversion(filters=8, kernel_size=3, strides=1, padding="same", dilation=1, size=16, channels=4, seed=0):
    """Converts a random `Conv2D` (random bias too) and measures the error on two random images.

    Args:
        filters, kernel_size, strides, padding, dilation: the convolution's
            arguments (``dilation`` is its ``dilation_rate``).
        size, channels: the images are ``size x size x channels``, N(0, 1).
        seed: seeds the convolution's initialisation and the images.

    Returns:
        A `ConversionMeasurement`.
    """
    for name, value in (
        ("filters", filters),
        ("kernel_size", kernel_size),
        ("strides", strides),
        ("dilation", dilation),
        ("size", size),
        ("channels", channels),
    ):
        check_positive_int(name, value)
    check_choice("padding", padding, ("same", "valid"))
    check_seed("seed", seed)
    check_tensor_bytes("The images", 4 * 2 * size * size * channels, f"size={size}, channels={channels}")
    check_tensor_bytes(
        "The convolution's kernel",
        4 * kernel_size**2 * channels * filters,
        f"kernel_size={kernel_size}, channels={channels}, filters={filters}",
    )
    needed = dilation * (kernel_size - 1) + 1
    if padding == "valid" and size < needed:
        raise ValueError(
            f"A {kernel_size}x{kernel_size} kernel with dilation {dilation} needs images of at least "
            f"{needed} pixels with padding='valid'. Received: size={size}"
        )
    keras.utils.set_random_seed(seed)
    conv = keras.layers.Conv2D(
        filters, kernel_size, strides=strides, padding=padding, dilation_rate=dilation, bias_initializer="random_normal"
    )
    images = np.random.default_rng(seed).normal(size=(2, size, size, channels)).astype("float32")
    expected = ops.convert_to_numpy(conv(images))
    layer = conv_to_attention(conv)
    got = ops.convert_to_numpy(layer(images))
    error = float(np.abs(got - expected).max())
    return ConversionMeasurement(
        layer.attention.num_heads, tuple(got.shape), error, error / float(np.abs(expected).max())
    )
