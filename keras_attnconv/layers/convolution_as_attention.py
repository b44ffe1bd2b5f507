"""`ConvolutionAsAttention`: the self-attention layer that computes what a convolution computes (Theorem 1).

`keras_attnconv.analysis.conversion.conv_to_attention` builds it from a convolution.
"""

import numbers

import keras
from keras import ops

from keras_attnconv.layers.relative_attention import RelativeMultiHeadAttention
from keras_attnconv.utils.checks import check_choice


def _same_padding(size, kernel, stride, dilation):
    """Keras/TensorFlow 'same' padding (before, after) of one axis."""
    reach = dilation * (kernel - 1) + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + reach - size, 0)
    return total // 2, total - total // 2


def _int_tuple(name, value, length):
    """`value` as a tuple of `length` positive Python ints, else ValueError naming `name`."""
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if len(values) != length or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in values
    ):
        raise ValueError(f"`{name}` must hold {length} positive integers. Received: {name}={value!r}")
    return tuple(int(v) for v in values)


@keras.saving.register_keras_serializable(package="keras_attnconv")
class ConvolutionAsAttention(keras.layers.Layer):
    """Self-attention equivalent of a convolution (see `conv_to_attention`).

    Zero-pads the input, applies a position-only quadratic
    `RelativeMultiHeadAttention` with one head per kernel tap, and reads the
    output at the strided anchors of the convolution's output window.

    Args:
        attention: the `RelativeMultiHeadAttention` (or its config).
        kernel_size, strides, dilation_rate: tuples of the convolution's rank.
        padding: ``"same"`` or ``"valid"``.

    Call arguments:
        inputs: (batch, H, W, C) for a 2-D convolution, (batch, L, C) for 1-D.

    Returns:
        The convolution's output shape.
    """

    def __init__(self, attention, kernel_size, strides, dilation_rate, padding, **kwargs):
        super().__init__(**kwargs)
        if isinstance(attention, dict):
            attention = keras.saving.deserialize_keras_object(attention)
        if not isinstance(attention, RelativeMultiHeadAttention):
            raise ValueError(
                "`attention` must be a RelativeMultiHeadAttention layer or its config. "
                f"Received: attention={attention!r}"
            )
        rank = len(kernel_size) if isinstance(kernel_size, (list, tuple)) and len(kernel_size) == 1 else 2
        self.kernel_size = _int_tuple("kernel_size", kernel_size, rank)  # a 1-D or 2-D convolution's
        self.strides = _int_tuple("strides", strides, rank)
        self.dilation_rate = _int_tuple("dilation_rate", dilation_rate, rank)
        check_choice("padding", padding, ("same", "valid"))
        self.attention = attention
        self.padding = padding
        self.rank = len(self.kernel_size)

    def _geometry(self, spatial):
        """Per axis (2-D view): padding before/after and output size."""
        sizes = (1, *spatial) if self.rank == 1 else tuple(spatial)
        kernels = (1, *self.kernel_size) if self.rank == 1 else self.kernel_size
        strides = (1, *self.strides) if self.rank == 1 else self.strides
        dilations = (1, *self.dilation_rate) if self.rank == 1 else self.dilation_rate
        geometry = []
        for size, kernel, stride, dilation in zip(sizes, kernels, strides, dilations):
            reach = dilation * (kernel - 1) + 1
            if self.padding == "same":
                before, _ = _same_padding(size, kernel, stride, dilation)
                out = -(-size // stride)
            else:
                before, out = 0, (size - reach) // stride + 1
            after = max((out - 1) * stride + reach - size - before, 0)
            geometry.append((before, after, out, stride))
        return geometry

    def _padded_shape(self, input_shape):
        spatial = input_shape[1:-1]
        if any(s is None for s in spatial):
            raise ValueError(f"Spatial dimensions must be known. Received: input_shape={tuple(input_shape)}")
        geometry = self._geometry(spatial)
        sizes = (1, *spatial) if self.rank == 1 else spatial
        return (input_shape[0], *(s + g[0] + g[1] for s, g in zip(sizes, geometry)), input_shape[-1])

    def build(self, input_shape):
        if not self.attention.built:
            self.attention.build(self._padded_shape(input_shape))

    def call(self, inputs):
        x = inputs[:, None] if self.rank == 1 else inputs
        geometry = self._geometry(inputs.shape[1:-1])
        x = ops.pad(x, [(0, 0), *((g[0], g[1]) for g in geometry), (0, 0)])
        y = self.attention(x)
        (_, _, out_h, stride_h), (_, _, out_w, stride_w) = geometry
        # The head centers are the taps' offsets from the anchor = the output's top-left tap.
        y = y[:, : (out_h - 1) * stride_h + 1 : stride_h, : (out_w - 1) * stride_w + 1 : stride_w]
        # The wrapped attention keeps its own dtype policy; the output follows this layer's, as Keras' do.
        y = ops.cast(y, self.compute_dtype)
        return y[:, 0] if self.rank == 1 else y

    def compute_output_shape(self, input_shape):
        geometry = self._geometry(input_shape[1:-1])
        spatial = tuple(g[2] for g in geometry)
        spatial = spatial[1:] if self.rank == 1 else spatial
        return (input_shape[0], *spatial, self.attention.output_dim)

    def get_config(self):
        return {
            **super().get_config(),
            "attention": keras.saving.serialize_keras_object(self.attention),
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "dilation_rate": self.dilation_rate,
            "padding": self.padding,
        }
