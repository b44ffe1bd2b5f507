"""Differentiable attention span: a learned per-head Gaussian window on the attention.

Follow-up thesis ("Multi-dimensional positional self-attention with
differentiable span", slides in ``shared/papers``): each head multiplies its
attention by a Gaussian of the shift ``delta = k - q``,

    g_h(delta) = exp(-1/2 sum_d ((delta_d - mu_hd) / sigma_hd)^2)

with a learnable center ``mu_h`` and diagonal covariance ``diag(sigma_h^2)``,
and keys where ``g_h < threshold`` are dropped: the learned span.

The modulation multiplies the *unnormalised* attention ``exp(score)`` by ``g``,
i.e. it adds ``log g`` to the scores before the softmax; equivalently it
multiplies the probabilities by ``g`` and renormalises. (Multiplying the
logits themselves by ``g`` would pull far keys' logits towards 0, which gives
them the average weight instead of removing them.) Working with ``log g``
keeps a collapsing span finite: ``sigma >= min_sigma`` bounds ``log g`` and
its gradients, and the key closest to a head's center is never masked, so no
query is left without keys (no NaN from a softmax over nothing).

A static ``max_window`` bounds the span's reach: keys outside the window (a
NATTEN neighbourhood, `keras_attnconv.layers.neighbourhood`) are masked too,
and the attention then runs on its windowed path, whose cost grows with the
window, not with the map.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.neighbourhood import get_neighbourhood, window_pair
from keras_attnconv.layers.shift_geometry import axis_shifts, centered_shifts, combine_axis_scores
from keras_attnconv.layers.validation import grid_size
from keras_attnconv.utils.checks import check_positive_int, check_positive_number, check_real


@keras.saving.register_keras_serializable(package="keras_attnconv")
class AttentionSpan(keras.layers.Layer):
    """Per-head Gaussian modulation of attention scores, with an optional hard span.

    In 2-D (``span_dims=2``) the Gaussian is over (row shift, column shift) of
    the image grid; in 1-D (``span_dims=1``) over the offset ``k - q`` of the
    tokens in row-major order, which is the sequence offset for a sequence fed
    as a ``(batch, 1, length, channels)`` map. All weights are float32 and the
    modulation is computed in float32 under any dtype policy.

    Args:
        num_heads: int, number of attention heads.
        span_dims: 1 or 2, see above.
        initial_sigma: float > min_sigma, initial standard deviation (in
            pixels/tokens) of every head and axis; the initial center is 0
            (the query itself).
        threshold: float in (0, 1) or None. Keys with ``g_h < threshold`` get
            exactly zero probability; None keeps the soft modulation only.
            With the default 0.1 the span is ``|delta - mu| <= 2.15 sigma``.
        min_sigma: float > 0, floor of the learned standard deviations.
        max_window: None, or the largest window the span may cover: an odd int
            or an (odd, odd) pair (rows, columns) for ``span_dims=2``, an odd
            int (tokens) for ``span_dims=1``. Keys outside it get zero
            probability, whatever sigma is learned; the key of largest ``g``
            inside it is always kept. The attention then runs on its windowed
            path (`RelativeMultiHeadAttention`'s ``window``), in
            ``O(tokens * window)`` instead of ``O(tokens^2)``.

    Call arguments:
        inputs: the feature map (batch, H, W, C); only its static shape is used.

    Returns:
        What the span adds to the attention scores (`score_bias`): ``log g_h``
        for every (query, key) pixel pair, -inf where a key is masked, float32
        (heads, H*W, H*W), batch-independent like the position scores.

    Example:
    >>> span = AttentionSpan(num_heads=4)
    >>> keras.ops.shape(span(keras.ops.zeros((1, 8, 8, 16))))
    (4, 64, 64)
    """

    center_and_spread_weights = ("span_center", "span_raw_sigma")

    def __init__(
        self, num_heads, span_dims=2, initial_sigma=4.0, threshold=0.1, min_sigma=0.05, max_window=None, **kwargs
    ):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        if span_dims not in (1, 2) or isinstance(span_dims, bool):
            raise ValueError(f"`span_dims` must be 1 or 2. Received: span_dims={span_dims!r}")
        check_positive_number("min_sigma", min_sigma)
        check_real("initial_sigma", initial_sigma, low=min_sigma, low_open=True)
        if threshold is not None:
            check_real("threshold", threshold, 0.0, 1.0, low_open=True, high_open=True)
        self.num_heads = int(num_heads)
        self.span_dims = int(span_dims)
        self.initial_sigma = float(initial_sigma)
        self.threshold = None if threshold is None else float(threshold)
        self.min_sigma = float(min_sigma)
        self.max_window = None if max_window is None else window_pair("max_window", max_window, self.span_dims)

    @property
    def separable(self):
        """Whether ``log g`` is a row term plus a column term with nothing masked (see `axis_log_modulation`)."""
        return self.span_dims == 2 and self.threshold is None and self.max_window is None

    @property
    def window(self):
        """``(window, dilation, flat)`` of the `Neighbourhood` that `max_window` gives, or None."""
        if self.max_window is None:
            return None
        if self.span_dims == 1:
            return (1, self.max_window[0]), (1, 1), True
        return self.max_window, (1, 1), False

    def neighbourhood(self, height, width):
        """The `Neighbourhood` of `max_window` on a grid, or None."""
        return None if self.window is None else get_neighbourhood(height, width, *self.window)

    def build(self, input_shape=None):
        shape = (self.num_heads, self.span_dims)
        self.span_center = self.add_weight(
            name="span_center", shape=shape, initializer="zeros", dtype="float32", autocast=False
        )
        # sigma = min_sigma + softplus(raw): positive, with gradients that stay finite both ways.
        excess = self.initial_sigma - self.min_sigma
        raw = excess + float(np.log(-np.expm1(-excess)))  # softplus^-1, without overflow for wide spans
        self.span_raw_sigma = self.add_weight(
            name="span_raw_sigma",
            shape=shape,
            initializer=keras.initializers.Constant(raw),
            dtype="float32",
            autocast=False,
        )

    @property
    def sigma(self):
        """Standard deviations of the Gaussians, tensor (heads, span_dims)."""
        return self.min_sigma + ops.softplus(ops.convert_to_tensor(self.span_raw_sigma))

    def axis_log_modulation(self, height, width):
        """``log g`` of a 2-D span as row and column terms: (heads, H, H), (heads, W, W)."""
        if self.span_dims != 2:
            raise ValueError(f"A 1-D span has no per-axis terms. Received: span_dims={self.span_dims}")
        rows, columns = centered_shifts(self.span_center, height, width)
        sigma = self.sigma
        return (-0.5 * ops.square(rows / sigma[:, 0, None, None]), -0.5 * ops.square(columns / sigma[:, 1, None, None]))

    def log_modulation(self, height, width):
        """``log g_h`` for every head and (query, key) pixel pair: (heads, H*W, H*W), float32."""
        if self.span_dims == 2:
            return combine_axis_scores(*self.axis_log_modulation(height, width))
        offsets = ops.subtract(
            axis_shifts(height * width)[None], ops.convert_to_tensor(self.span_center)[:, 0, None, None]
        )
        return -0.5 * ops.square(offsets / self.sigma[:, 0, None, None])

    def score_bias(self, height, width, window_mask=None):
        """What the span adds to the scores: ``log g``, -inf for keys under the threshold; (heads, H*W, H*W).

        The key of largest ``g`` is kept for every query, so each softmax row
        has a finite maximum even when the span has shrunk below one pixel.
        Keys outside `max_window`, and outside ``window_mask`` ((T, T) bool,
        the attention's own window) when given, are masked and never count as
        that key.
        """
        neighbourhood = self.neighbourhood(height, width)
        if neighbourhood is not None:
            own = neighbourhood.window_mask()
            window_mask = own if window_mask is None else np.logical_and(window_mask, own)
        return self._threshold(self.log_modulation(height, width), window_mask)

    def window_score_bias(self, neighbourhood):
        """`score_bias` for the tile pairs of windowed attention: (heads, tiles, Bq, Rk), float32.

        Computed from the pairs' shifts (`Neighbourhood.row_shift`, ``col_shift``, ``offset``), so
        nothing of size (T, T) is formed; keys outside the window are masked.
        """
        centers, sigma = ops.convert_to_tensor(self.span_center), self.sigma
        axes = (neighbourhood.row_shift, neighbourhood.col_shift) if self.span_dims == 2 else (neighbourhood.offset,)
        log_g = 0.0
        for axis, shift in enumerate(axes):
            z = (
                ops.subtract(shift.astype("float32")[None], centers[:, axis, None, None, None])
                / sigma[:, axis, None, None, None]
            )
            log_g = log_g - 0.5 * ops.square(z)
        return self._threshold(log_g, neighbourhood.mask)

    def _threshold(self, log_g, window_mask):
        """``log g`` with -inf outside `window_mask` (None: no window) and, with a threshold, under it."""
        if window_mask is not None:
            log_g = ops.where(window_mask[None], log_g, -np.inf)
        if self.threshold is None:
            return log_g
        keep = ops.logical_or(log_g >= math.log(self.threshold), log_g >= ops.max(log_g, axis=-1, keepdims=True))
        return ops.where(keep, log_g, -np.inf)

    def modulate(self, scores, height, width, window_mask=None):
        """Scores (..., heads, H*W, H*W) plus `score_bias`, float32."""
        return ops.cast(scores, "float32") + self.score_bias(height, width, window_mask)

    def call(self, inputs):
        """`score_bias` for the static grid of ``inputs`` (batch, H, W, C), as position scores are called."""
        height, width = grid_size(inputs.shape)
        return self.score_bias(height, width)

    def compute_output_shape(self, input_shape):
        tokens = input_shape[1] * input_shape[2]
        return (self.num_heads, tokens, tokens)

    def compute_output_spec(self, inputs):
        # float32 under any policy, like the scores it is added to.
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "span_dims": self.span_dims,
                "initial_sigma": self.initial_sigma,
                "threshold": self.threshold,
                "min_sigma": self.min_sigma,
                "max_window": (self.max_window[0] if self.max_window and self.span_dims == 1 else self.max_window),
            }
        )
        return config


def get_attention_span(span, num_heads):
    """An attention's `attention_span` argument as an `AttentionSpan` of `num_heads` heads, or None.

    `span` is None, an `AttentionSpan`, its serialized config or a dict of its arguments (built with
    `num_heads`); anything else, or a span with other heads, is a ValueError naming the argument.
    """
    if span is None:
        return None
    if isinstance(span, dict):
        if "class_name" in span:
            span = keras.saving.deserialize_keras_object(span)
        else:
            span = AttentionSpan(num_heads, **span)
    if not isinstance(span, AttentionSpan):
        raise ValueError(
            "`attention_span` must be None, an AttentionSpan, or a dict of its arguments. "
            f"Received: attention_span={span!r}"
        )
    if span.num_heads != num_heads:
        raise ValueError(
            f"`attention_span` must have one span per head of the attention (num_heads={num_heads}). "
            f"Received: attention_span with num_heads={span.num_heads}"
        )
    return span
