"""Theorem 1 as code: turn a convolution into self-attention that computes the same function.

A K x K convolution is a sum over the K^2 kernel taps of ``W_tap x[q + shift_tap]``.
With one position-only quadratic head per tap, centred on that tap's shift with
a large ``alpha``, each head attends to exactly one pixel (Lemma 2), and the
merged value/output kernel of head ``tap`` is ``W_tap`` (Lemma 1). Zero padding,
strides and the output window are handled around the attention: the input is
zero-padded so that every tap lands on a real (possibly zero) pixel, and the
output is read at the strided anchor positions.
"""

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.position_scores import QuadraticScore
from keras_attnconv.layers.relative_attention import RelativeMultiHeadAttention

#: Softmax weight of a pixel one step from a head's centre is exp(-alpha):
#: exp(-100) ~ 4e-44 is below float32 resolution next to 1 (Lemma 2 needs >= 46).
CONVERSION_ALPHA = 100.0


def _same_padding(size, kernel, stride, dilation):
    """Keras/TensorFlow 'same' padding (before, after) of one axis."""
    reach = dilation * (kernel - 1) + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + reach - size, 0)
    return total // 2, total - total // 2


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
        self.attention = attention
        self.kernel_size = tuple(kernel_size)
        self.strides = tuple(strides)
        self.dilation_rate = tuple(dilation_rate)
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
        # The head centres are the taps' offsets from the anchor = the output's top-left tap.
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


def conv_to_attention(conv, alpha=CONVERSION_ALPHA):
    """Returns a layer of self-attention that computes what `conv` computes (Theorem 1).

    Args:
        conv: a built `keras.layers.Conv2D` or `keras.layers.Conv1D` with
            ``padding`` "same" or "valid", ``channels_last``, ``groups=1``.
        alpha: the quadratic encoding's sharpness (default 100, hard in float32).

    Returns:
        A `ConvolutionAsAttention` layer: ``conv.kernel_size`` product heads,
        centres on the (dilated) kernel grid, value/output kernel and bias
        from the convolution. Its ``.attention`` is the position-only quadratic
        `RelativeMultiHeadAttention`.

    Example:
    >>> conv = keras.layers.Conv2D(8, 3, padding="same")
    >>> conv.build((None, 16, 16, 4))
    >>> layer = conv_to_attention(conv)
    >>> layer.attention.num_heads
    9
    """
    if not isinstance(conv, (keras.layers.Conv1D, keras.layers.Conv2D)) or isinstance(
            conv, (keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose)):
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
        raise ValueError("The convolution must be linear (apply its activation after the attention). "
                         f"Received: activation={keras.activations.serialize(conv.activation)!r}")

    kernel = ops.convert_to_numpy(conv.kernel)
    kernel = kernel[None] if kernel.ndim == 3 else kernel  # Conv1D as a 1 x K convolution
    kernel_h, kernel_w, channels_in, channels_out = kernel.shape
    dilation = (1, *conv.dilation_rate) if len(conv.dilation_rate) == 1 else conv.dilation_rate
    taps = [(i, j) for i in range(kernel_h) for j in range(kernel_w)]
    centers = np.array([(i * dilation[0], j * dilation[1]) for i, j in taps], "float32")

    score = QuadraticScore(len(taps), dtype="float32")
    attention = RelativeMultiHeadAttention(
        num_heads=len(taps), output_dim=channels_out, position_score=score, use_bias=conv.use_bias,
        dropout=0.0, dtype=conv.dtype_policy,
    )
    layer = ConvolutionAsAttention(attention, conv.kernel_size, conv.strides, conv.dilation_rate, conv.padding,
                                   dtype=conv.dtype_policy, name=f"{conv.name}_as_attention")
    attention.build((None, kernel_h * dilation[0] + 1, kernel_w * dilation[1] + 1, channels_in))
    score.centers.assign(centers)
    score.alpha.assign(np.full(len(taps), alpha, "float32"))
    attention.output_kernel.assign(np.stack([kernel[i, j] for i, j in taps]))
    if conv.use_bias:
        attention.output_bias.assign(ops.convert_to_numpy(conv.bias))
    return layer
