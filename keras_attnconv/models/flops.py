"""Analytical FLOP count of the zoo's models, per image.

Convention: 2 FLOPs per multiply-add of a matrix product or convolution;
biases, normalisation, activations and softmax are not counted. Two parts:

- ``linear``: products with weight kernels (convolutions, Dense layers,
  attention query/key/value/output projections). This is what the paper's
  Table 1 counts (its 1.1B / 6.2B / 4.9B / 15B match it to 2 digits).
- ``attention``: the data-dependent products of attention (scores
  ``q.k`` and ``q.r``, and the probability-weighted sum over keys).

Work that does not depend on the batch (position-only scores) is amortised
over the batch and not counted.

On the windowed (neighbourhood) path two counts differ: by default the
algorithm's (each query meets the ``Kh * Kw`` keys of its window), and with
``executed=True`` the products the tiled implementation runs (every query
slot of a tile against every key of its region, masked keys included; see
`RelativeMultiHeadAttention.windowed_multiply_adds`). On the other paths both are the
same. `tests/models/test_flops.py` checks the executed count against
TensorFlow's own per-op FLOP statistics of the traced graph on every path.
"""

import dataclasses
import math

import keras

from keras_attnconv.layers import RelativeMultiHeadAttention, TransformerEncoderBlock


@dataclasses.dataclass(frozen=True)
class FlopCount:
    linear: int = 0
    attention: int = 0

    @property
    def total(self):
        return self.linear + self.attention

    def __add__(self, other):
        return FlopCount(self.linear + other.linear, self.attention + other.attention)


def _attention_flops(layer, input_shape, executed=False):
    height, width, channels = input_shape[1:]
    mode = layer.attention_mode_for(height, width)
    if executed and mode.startswith("windowed"):
        linear, attention = layer.windowed_multiply_adds(height, width)
        return FlopCount(2 * linear, 2 * attention)
    tokens = height * width
    heads, key_dim, out_dim = layer.num_heads, layer.key_dim, layer.output_dim  # a built layer
    projection = 2 * tokens * channels * heads * key_dim
    linear = 2 * tokens * heads * channels * out_dim  # merged value/output kernel
    carried = min(out_dim, channels)  # the attention contraction carries the narrower width
    # Windowed attention: each query meets the K = Kh * Kw keys of its window (the algorithm's count;
    # the tiles also score the masked keys of their regions, see `keras_attnconv.layers.neighbourhood`).
    window = layer.neighbourhood(height, width).window if mode.startswith("windowed") else None
    keys = tokens if window is None else window[0] * window[1]
    if mode == "separable":  # a row pass and a column pass
        attention = 2 * heads * tokens * (height + width) * carried
    elif window is not None:  # the windowed path contracts the input channels
        attention = 2 * heads * tokens * keys * channels
    else:
        attention = 2 * heads * tokens * tokens * carried
    if layer.use_content_content or layer.use_content_position:
        linear += projection
    if layer.use_content_content or layer.use_key_bias:
        linear += projection
    if layer.use_content_content:
        attention += 2 * heads * tokens * keys * key_dim
    if layer.use_key_bias:
        attention += 2 * heads * tokens * key_dim
    if layer.use_content_position:
        score = layer.position_score
        if layer.position_key_projection:
            linear += 2 * tokens * heads * key_dim * score.encoding_dim
        attention += 2 * heads * score.content_position_multiply_adds(height, width, window)
    return FlopCount(linear, attention)


def _dense_flops(input_shape, units):
    return FlopCount(linear=2 * math.prod(input_shape[1:-1]) * input_shape[-1] * units)


def _block_flops(block, input_shape, executed):
    hidden = input_shape[-1]
    return (
        _attention_flops(block.attention, input_shape, executed)
        + _dense_flops(input_shape, hidden)
        + _dense_flops(input_shape, block.intermediate_dim)
        + _dense_flops((*input_shape[:-1], block.intermediate_dim), hidden)
    )


def layer_flops(layer, input_shape, executed=False):
    """FLOPs per image of one layer given its (batch, ...) input shape (`executed`: see the module docstring)."""
    if isinstance(layer, TransformerEncoderBlock):
        return _block_flops(layer, input_shape, executed)
    if isinstance(layer, RelativeMultiHeadAttention):
        return _attention_flops(layer, input_shape, executed)
    if isinstance(layer, keras.layers.Dense):
        return _dense_flops(input_shape, layer.units)
    if isinstance(layer, keras.layers.Conv2D):
        output_shape = layer.compute_output_shape(input_shape)
        kernel_h, kernel_w = layer.kernel_size
        per_output = 2 * kernel_h * kernel_w * input_shape[-1] // layer.groups
        return FlopCount(linear=math.prod(output_shape[1:]) * per_output)
    return FlopCount()


def count_flops(model, executed=False):
    """FLOPs per image of a functional model: the algorithm's, or with `executed` what runs (module docstring)."""
    total = FlopCount()
    for layer in model.layers:
        if isinstance(
            layer, (TransformerEncoderBlock, RelativeMultiHeadAttention, keras.layers.Dense, keras.layers.Conv2D)
        ):
            total = total + layer_flops(layer, tuple(layer.input.shape), executed)
    return total
