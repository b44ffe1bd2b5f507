"""Multi-head self-attention over pixels with relative position scores, eq. (8).

The layer owns the weights and its parts (position score, attention span,
dropout), picks the path on each grid (`attention_mode_for`) and hands tensors
to the path functions: `keras_attnconv.layers.attention_paths` (global and
separable paths), `keras_attnconv.layers.key_folded_attention` (content
attention with the key projection folded into the queries, on accelerators) and
`keras_attnconv.layers.windowed_attention` (the tiled neighbourhood path).
`RelativeMultiHeadAttention._compute_attention` is the one hook of the attention
computation for subclasses.

For head h, query pixel q, key pixel k and shift ``delta = k - q``::

    A[q, k] = s * (X_q Wq Wk^T X_k^T + X_q Wq W_hat r_delta + u^T Wk^T X_k^T)
              + v^T r_delta
    MHSA(X) = concat_h(softmax(A^(h)) X) W + b

Each of the four terms can be switched on or off. The position terms come
from a position score layer (``r_delta`` and ``v``, see
`keras_attnconv.layers.PositionScore`); ``W_hat`` is the identity padded
to the query dimension as in the proof of Lemma 2 (the first
``encoding_dim`` query features meet ``r_delta``), or a learned
``(heads, key_dim, encoding_dim)`` map with ``position_key_projection=True``.
``s`` (``content_scale``) scales the data-dependent terms; the position bias
is left unscaled so that Lemma 2 holds with the score's own ``alpha``.

Values use the paper's parameterisation (D_h = D_in): every head averages
the input itself, and ``W_val^(h) W_out`` are merged into one kernel of
shape ``(num_heads, input_dim, output_dim)``. With only the position bias
on, the probabilities do not depend on the input: they are computed once
per call, ``(heads, H*W, H*W)``, and applied to the whole batch (dropout
then drops the same links for every example). Scores and softmax are
float32 under any dtype policy; projections and contractions run in the
compute dtype.
"""

import functools

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.attention_paths import (
    ScoreWeights,
    attention_scores,
    general_attention,
    global_score_parts,
    per_example,
    separable_attention,
    separable_probabilities,
    separable_window_entries,
    shared_position_attention,
    window_entries,
)
from keras_attnconv.layers.attention_span import get_attention_span
from keras_attnconv.layers.dropout import Dropout
from keras_attnconv.layers.fan_in_uniform import initializer_for
from keras_attnconv.layers.key_folded_attention import key_folded_attention
from keras_attnconv.layers.neighbourhood import get_neighbourhood, window_arguments
from keras_attnconv.layers.path_rule import (
    attention_mode,
    check_path_arguments,
    folds_content_position,
    folds_key_projection,
)
from keras_attnconv.layers.position_score_factory import (
    POSITION_SCORES,
    check_score_fits_attention,
    get_position_score,
    position_score_class,
)
from keras_attnconv.layers.validation import get_initializer, grid_size, real_inputs
from keras_attnconv.layers.windowed_attention import (
    window_position_terms,
    window_probabilities,
    windowed_attention,
    windowed_multiply_adds,
)
from keras_attnconv.utils.checks import check_bool, check_positive_int, check_positive_number, check_rate

_TERMS = ("use_content_content", "use_content_position", "use_key_bias", "use_position_bias")
# The constructor's arguments, in the order of `get_config`.
_ARGUMENTS = (
    "num_heads",
    "output_dim",
    "position_score",
    *_TERMS,
    "key_dim",
    "content_scale",
    "position_key_projection",
    "dropout",
    "use_bias",
    "kernel_initializer",
    "bias_initializer",
    "separable",
    "attention_span",
    "window",
    "dilation",
    "windowed",
    "rematerialize",
)
# The weights of the data-dependent score terms, in the order of `ScoreWeights` (absent: None).
_SCORE_WEIGHTS = ("query_kernel", "query_bias", "key_kernel", "key_bias", "u", "position_key_kernel")


@keras.saving.register_keras_serializable(package="keras_attnconv")
class RelativeMultiHeadAttention(keras.layers.Layer):
    """Self-attention over the pixels of a feature map, eq. (8) of the paper.

    The scores, values and precisions are the module's (see its docstring).

    The layer owns the weights and picks the path (`attention_mode_for`); the
    paths are functions of tensors (`keras_attnconv.layers.attention_paths`,
    `keras_attnconv.layers.windowed_attention`). A subclass changes the
    attention computation by overriding `_compute_attention` (see there).

    Args:
        num_heads: int, number of heads.
        output_dim: int or None, output channels (default: input channels).
        position_score: a name of `POSITION_SCORES` (``"quadratic"``, ``"gaussian"``, ``"learned"``, ...),
            a `PositionScore` layer, or its serialized config; None when no
            position term is used. Names are built with ``num_heads`` heads
            and ``key_dim`` (see `get_position_score`).
        use_content_content: bool, term ``X_q Wq Wk^T X_k``.
        use_content_position: bool, term ``X_q Wq W_hat r_delta``.
        use_key_bias: bool, term ``u^T Wk X_k``.
        use_position_bias: bool, term ``v^T r_delta``.
        key_dim: int or None, query/key size per head (default: input channels).
        content_scale: float or None, ``s`` above; None means ``1/sqrt(key_dim)``.
        position_key_projection: bool, learn ``W_hat`` instead of the padded identity.
        dropout: float in [0, 1), dropout on attention probabilities.
        use_bias: bool, biases on the query/key projections and the output.
        kernel_initializer, bias_initializer: initializers of the projections.
        separable: ``"auto"``, True or False: position-only heads whose scores
            are a row term plus a column term (quadratic, learned, diagonal
            Gaussian) as a row pass and a column pass where faster on the device
            (`path_rule.prefers_separable`), always, or never (the general path,
            the reference). `attention_mode` reports the path taken.
        attention_span: None, an `AttentionSpan` layer, a dict of its arguments
            (``{"threshold": 0.1, "initial_sigma": 4.0}``; built with
            ``num_heads``) or its serialized config: a learned per-head Gaussian
            window added (as ``log g``) to the scores, keys under its threshold
            masked. A span without a threshold keeps separable heads
            separable; one with a ``max_window`` gives the layer that window.
        window: None (global attention), or an odd int or (odd, odd) pair
            ``(Kh, Kw)``: each query attends to a ``Kh x Kw`` window of keys,
            shifted to stay inside the map, with the true shifts in the
            position terms (NATTEN's rule, `keras_attnconv.layers.neighbourhood`).
            A side longer than the map (dilation 1) is clipped to the map.
        dilation: positive int or pair, the window's dilation (NATTEN's rule);
            ``window * dilation`` must not exceed the map's side.
        windowed: ``"auto"``, True or False, with a window: the tiled windowed
            path (``O(H W Kh Kw)``, never a (T, T) tensor) where cheaper
            (`path_rule.prefers_windowed`), always, or never (global attention
            with the window as a -inf mask, the reference).
        rematerialize: bool, the windowed path recomputes its per-head tensors
            in the backward pass and keeps only the probabilities
            (`windowed_attention.windowed_attention`); no effect elsewhere.

    Call arguments:
        inputs: tensor (batch, H, W, C) with static H, W, C; integer inputs
            (e.g. uint8 pixels) are cast to the compute dtype, as values.
        training: bool, whether dropout is active.
        return_attention_scores: bool, also return the attention probabilities
            (before dropout), float32 (batch, heads, H*W, H*W). With a window:
            the pair ``(probabilities, key_indices)``: probabilities float32
            (batch, heads, T, K) of every query's ``K = Kh * Kw`` window keys
            and key_indices int32 (T, K), the flat (row-major, ``i * W + j``)
            position of each of those keys, in row-major window order:
            ``probabilities[b, h, q, s]`` is the weight of key
            ``key_indices[q, s]`` for query ``q``; every other key has weight 0.

    Returns:
        Tensor (batch, H, W, output_dim), or ``(output, scores)`` with the
        scores above.

    Example:
    >>> layer = RelativeMultiHeadAttention(num_heads=9, position_score="quadratic")
    >>> keras.ops.shape(layer(keras.ops.ones((2, 8, 8, 16))))
    (2, 8, 8, 16)
    """

    def __init__(
        self,
        num_heads,
        output_dim=None,
        position_score="quadratic",
        use_content_content=False,
        use_content_position=False,
        use_key_bias=False,
        use_position_bias=True,
        key_dim=None,
        content_scale=None,
        position_key_projection=False,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        separable="auto",
        attention_span=None,
        window=None,
        dilation=1,
        windowed="auto",
        rematerialize=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        terms = dict(zip(_TERMS, (use_content_content, use_content_position, use_key_bias, use_position_bias)))
        _check_arguments(
            num_heads,
            output_dim,
            key_dim,
            dropout,
            content_scale,
            terms,
            position_score,
            separable,
            position_key_projection=position_key_projection,
            use_bias=use_bias,
        )
        needs_positions = use_content_position or use_position_bias
        self.num_heads = int(num_heads)
        # The arguments, as given (None: the input channels); the `output_dim` and `key_dim` properties resolve them.
        self._output_dim, self._key_dim = output_dim, key_dim
        self.input_dim = None  # set by build()
        self.use_content_content, self.use_content_position = use_content_content, use_content_position
        self.use_key_bias, self.use_position_bias = use_key_bias, use_position_bias
        self.content_scale = None if content_scale is None else float(content_scale)
        self.position_key_projection = position_key_projection
        self.dropout = float(dropout)
        self.use_bias = use_bias
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        # A named score is created in build(), once key_dim is known; an instance
        # (or its config) is used as given. Only the name is kept apart: storing the
        # instance twice would make Keras track it twice.
        self._position_score_name = position_score if needs_positions and isinstance(position_score, str) else None
        self.position_score = None
        if needs_positions and not isinstance(position_score, str):
            self.position_score = get_position_score(position_score, self.num_heads)
            check_score_fits_attention(self.position_score, self.num_heads, self.use_position_bias)
        self.separable = separable
        self.attention_span = get_attention_span(attention_span, self.num_heads)
        self.window, self.dilation = window_arguments(window, dilation)
        check_path_arguments(
            separable,
            windowed,
            self.uses_content,
            self.position_score or POSITION_SCORES.get(self._position_score_name),
            self.window,
            self.attention_span,
            None if self._takes_the_fast_paths() else type(self).__name__,
        )
        self.windowed = windowed
        check_bool("rematerialize", rematerialize)
        self.rematerialize = rematerialize
        self.dropout_layer = Dropout(self.dropout, dtype="float32")
        # The separable path drops row and column links independently, each with the rate that
        # keeps a (query, key) link with probability 1 - dropout, as the general path does.
        self.axis_dropout_layer = Dropout(1.0 - (1.0 - self.dropout) ** 0.5, dtype="float32")
        self._attention_mode = None

    @property
    def window_spec(self):
        """``(window, dilation, flat)`` of the layer's ``window``, else of its span's ``max_window``
        (``flat``: a 1-D window over the row-major tokens, from a 1-D span), or None (global attention)."""
        if self.window is not None:
            return self.window, self.dilation, False
        return None if self.attention_span is None else self.attention_span.window

    def neighbourhood(self, height, width):
        """The `Neighbourhood` (static index tables) of the window on a grid, or None without a window."""
        spec = self.window_spec
        return None if spec is None else get_neighbourhood(height, width, *spec)

    @property
    def uses_content(self):
        """Whether the attention probabilities depend on the input."""
        return ScoreWeights(self.use_content_content, self.use_content_position, self.use_key_bias).uses_content

    @property
    def key_dim(self):
        """Query/key size per head: the `key_dim` argument, or the input channels once built (else None)."""
        return self._key_dim or self.input_dim

    @property
    def output_dim(self):
        """Output channels: the `output_dim` argument, or the input channels once built (else None)."""
        return self._output_dim or self.input_dim

    @property
    def attention_mode(self):
        """The path taken on the grid the layer was built for (see `attention_mode_for`); None before."""
        return self._attention_mode

    def attention_mode_for(self, height, width, platform=None):
        """The path taken on a ``height x width`` grid: ``"content"``, ``"position"``, ``"separable"``,
        ``"windowed_content"`` or ``"windowed_position"`` (`keras_attnconv.layers.path_rule.attention_mode`).

        ``platform``: ``"cpu"``, ``"gpu"`` or ``"tpu"``; None means the device the backend computes on.
        A subclass that overrides `_compute_attention` takes "content" or "position" only.
        """
        return attention_mode(
            height,
            width,
            self.uses_content,
            self.separable,
            self.windowed,
            self.position_score,
            self.attention_span,
            self.neighbourhood(height, width),
            platform,
            fast_paths=self._takes_the_fast_paths(),
        )

    def _takes_the_fast_paths(self):
        """Whether the separable and windowed paths may run: they compute the default `_compute_attention` only."""
        return type(self)._compute_attention is RelativeMultiHeadAttention._compute_attention

    def build(self, input_shape):
        height, width = grid_size(input_shape)
        self.neighbourhood(height, width)  # a window that does not fit the map raises here
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(f"The channel dimension must be known. Received: input_shape={tuple(input_shape)}")
        self.input_dim = int(channels)
        self.input_spec = keras.InputSpec(ndim=4, axes={-1: self.input_dim})
        self._scale = self.content_scale if self.content_scale is not None else self.key_dim**-0.5
        if self._position_score_name is not None and self.position_score is None:
            self.position_score = get_position_score(
                self._position_score_name,
                self.num_heads,
                key_dim=self.key_dim,
                head_vectors=self.use_position_bias,
                dtype="float32",
            )
        for part in (self.position_score, self.attention_span):
            if part is not None and not part.built:
                part.build(input_shape)
        head_shape = (self.num_heads, self.key_dim)
        if self.use_content_content or self.use_content_position:
            self.query_kernel = self._kernel("query_kernel", (self.input_dim, *head_shape), self.input_dim)
            self.query_bias = self._bias("query_bias", head_shape, self.input_dim)
        if self.use_content_content or self.use_key_bias:
            self.key_kernel = self._kernel("key_kernel", (self.input_dim, *head_shape), self.input_dim)
            self.key_bias = self._bias("key_bias", head_shape, self.input_dim)
        if self.use_key_bias:
            self.u = self.add_weight(name="u", shape=head_shape, initializer="zeros")
        if self.use_content_position:
            encoding_dim = self.position_score.encoding_dim
            if self.position_key_projection:
                self.position_key_kernel = self._kernel(
                    "position_key_kernel", (self.num_heads, self.key_dim, encoding_dim), self.key_dim
                )
            elif encoding_dim > self.key_dim:
                raise ValueError(
                    f"The content-position term with the identity W_hat needs the position score's encoding_dim "
                    f"({encoding_dim}) <= key_dim: use position_key_projection=True or a larger key_dim. "
                    f"Received: key_dim={self.key_dim}"
                )
        # The merged value/output kernel is one linear map of the heads' concatenated contexts.
        contexts = self.num_heads * self.input_dim
        self.output_kernel = self._kernel("output_kernel", (self.num_heads, self.input_dim, self.output_dim), contexts)
        self.output_bias = self._bias("output_bias", (self.output_dim,), contexts)
        self._attention_mode = self.attention_mode_for(height, width)

    def _kernel(self, name, shape, fan_in, initializer=None):
        """A kernel of the products with `fan_in` inputs (which a `FanInUniform` initializer bounds by)."""
        initializer = initializer_for(initializer or self.kernel_initializer, fan_in)
        return self.add_weight(name=name, shape=shape, initializer=initializer)

    def _bias(self, name, shape, fan_in):
        return self._kernel(name, shape, fan_in, self.bias_initializer) if self.use_bias else None

    def _score_weights(self):
        """The weights of the data-dependent score terms, as the path functions take them (a built layer)."""
        return ScoreWeights(
            self.use_content_content,
            self.use_content_position,
            self.use_key_bias,
            self._scale,
            *(getattr(self, name, None) for name in _SCORE_WEIGHTS),
        )

    def call(self, inputs, training=None, return_attention_scores=False):
        # Keras autocasts floating inputs only; integer images are cast here, as values.
        inputs = real_inputs(inputs, self.compute_dtype)
        height, width = grid_size(inputs.shape)
        mode = self.attention_mode_for(height, width)
        neighbourhood = self.neighbourhood(height, width)
        if mode == "separable":
            outputs, probabilities = self._call_separable(inputs, neighbourhood, training)
        else:
            tokens = ops.reshape(inputs, (-1, height * width, self.input_dim))
            if mode.startswith("windowed"):
                outputs, probabilities = self._call_windowed(tokens, neighbourhood, training)
            else:
                outputs, probabilities = self._call_global(tokens, height, width, neighbourhood, training)
        if self.output_bias is not None:
            outputs = outputs + self.output_bias
        if mode != "separable":
            outputs = ops.reshape(outputs, (-1, height, width, self.output_dim))
        if not return_attention_scores:
            return outputs
        return outputs, _returned_scores(mode, probabilities, neighbourhood, ops.shape(inputs)[0])

    def _call_global(self, tokens, height, width, neighbourhood, training):
        window_mask = None if neighbourhood is None else neighbourhood.window_mask()
        position_bias = (
            self.position_score.peaked_position_scores(height, width, _axis_window_keys(neighbourhood))
            if self.use_position_bias
            else None
        )
        span_bias = None if self.attention_span is None else self.attention_span.score_bias(height, width, window_mask)
        weights = self._score_weights()
        if (
            weights.use_content_content
            and self._takes_the_fast_paths()
            and folds_key_projection(self.key_dim, self.input_dim)
        ):
            return key_folded_attention(
                tokens,
                weights,
                height,
                width,
                self.output_kernel,
                self.position_score,
                position_bias,
                span_bias,
                window_mask,
                functools.partial(self.dropout_layer, training=training),
                fold_content_position=folds_content_position(),
            )
        queries, keys, score_terms = global_score_parts(
            tokens,
            weights,
            height,
            width,
            self.position_score,
            position_bias,
            span_bias,
            fold_content_position=folds_content_position(),
        )
        return self._compute_attention(queries, keys, tokens, score_terms, window_mask, training=training)

    def _compute_attention(self, queries, keys, values, score_terms, attention_mask=None, training=None):
        """The attention computation of the global paths: the one hook for subclasses.

        Per head, ``scores = q . k + sum(score_terms)``, -inf where `attention_mask` is False
        (`attention_paths.attention_scores`), ``P = softmax(scores)`` and
        ``outputs = sum_h dropout(P_h) values W_h`` with the merged value/output kernel ``W``
        (`output_kernel`). Called on the ``"content"`` and ``"position"`` paths
        (`attention_mode_for`), with or without a window. The
        ``"separable"`` and ``"windowed_*"`` paths compute this default in other layouts
        (row and column factors; tiles of keys) and never call it, so a layer whose class
        overrides it never takes them (``separable=True`` and ``windowed=True`` are refused).

        Args:
            queries: (batch, T, heads, key_dim), the scaled queries ``s (X Wq + b_q)`` of the
                content-content term, in the compute dtype; None when that term is off.
            keys: (batch, T, heads, key_dim), ``X Wk + b_k``; None with `queries`.
            values: (batch, T, C), the tokens (the values are the input itself).
            score_terms: tuple of float32 tensors, the other terms of the scores (key bias,
                content-position, position bias, the span's ``log g``) in the order they are
                added (`attention_paths.global_score_parts`); none has a batch axis on the
                "position" path.
            attention_mask: None (global attention), or a bool NumPy (T, T) window: whether
                a query attends to a key.
            training: whether attention dropout is active.

        Returns:
            ``(outputs, probabilities)``: (batch, T, output_dim) in the compute dtype, before
            the output bias; float32 probabilities before dropout, (batch, heads, T, T), or
            (heads, T, T) when shared by the batch.
        """
        dropout = functools.partial(self.dropout_layer, training=training)
        if queries is None and all(ops.ndim(term) < 4 for term in score_terms):
            position_scores = attention_scores(None, None, score_terms, attention_mask)
            return shared_position_attention(position_scores, values, self.output_kernel, dropout)
        return general_attention(queries, keys, values, self.output_kernel, score_terms, attention_mask, dropout)

    def _call_windowed(self, tokens, neighbourhood, training):
        def position_terms():  # called where the scores are computed (inside a rematerialized piece)
            span_bias = None if self.attention_span is None else self.attention_span.window_score_bias(neighbourhood)
            if not self.use_position_bias:
                return window_position_terms(neighbourhood, span_bias=span_bias)
            window_keys = _axis_window_keys(neighbourhood)
            if self.position_score.peaks_in_closed_form and window_keys is not None:
                # Per axis, peaked at an exact 0 in every window: its best key is finite however far the center.
                axis_scores = self.position_score.peaked_axis_scores(
                    neighbourhood.height, neighbourhood.width, window_keys
                )
                return window_position_terms(neighbourhood, span_bias=span_bias, axis_scores=axis_scores)
            shift_scores = self.position_score.shift_scores(neighbourhood.height, neighbourhood.width)
            return window_position_terms(neighbourhood, shift_scores, span_bias)

        return windowed_attention(
            tokens,
            neighbourhood,
            self.output_kernel,
            self._score_weights(),
            position_terms,
            self.position_score,
            functools.partial(self.dropout_layer, training=training),
            self.rematerialize,
        )

    def _call_separable(self, inputs, neighbourhood, training):
        height, width = inputs.shape[1], inputs.shape[2]
        row_scores, column_scores = self.position_score.peaked_axis_scores(
            height, width, _axis_window_keys(neighbourhood)
        )
        if self.attention_span is not None:
            row_span, column_span = self.attention_span.axis_log_modulation(height, width)
            row_scores, column_scores = row_scores + row_span, column_scores + column_span
        if neighbourhood is not None:
            # The window is a row window times a column window: mask each axis outside its own.
            row_mask, column_mask = neighbourhood.axis_masks()
            row_scores = ops.where(row_mask, row_scores, -np.inf)
            column_scores = ops.where(column_mask, column_scores, -np.inf)
        return separable_attention(
            row_scores,
            column_scores,
            inputs,
            self.output_kernel,
            functools.partial(self.axis_dropout_layer, training=training),
        )

    def windowed_multiply_adds(self, height, width):
        """Multiply-adds per example of the windowed path on a grid, ``(linear, attention)`` (`windowed_attention`)."""
        return windowed_multiply_adds(
            self.neighbourhood(height, width),
            self._score_weights(),
            self.num_heads,
            self.input_dim,
            self.output_dim,
            self.position_score,
        )

    def compute_output_shape(self, input_shape):
        return (*tuple(input_shape)[:-1], self._output_dim or input_shape[-1])

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False):
        outputs = keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype=self.compute_dtype)
        if not return_attention_scores:
            return outputs
        tokens = inputs.shape[1] * inputs.shape[2]
        neighbourhood = self.neighbourhood(*grid_size(inputs.shape))
        keys = tokens if neighbourhood is None else neighbourhood.keys_per_query
        scores = keras.KerasTensor((inputs.shape[0], self.num_heads, tokens, keys), dtype="float32")
        if neighbourhood is None:
            return outputs, scores
        return outputs, (scores, keras.KerasTensor((tokens, keys), dtype="int32"))

    def get_config(self):
        config = super().get_config()
        score = self._position_score_name
        if score is None and self.position_score is not None:
            score = keras.saving.serialize_keras_object(self.position_score)
        resolved = {
            "output_dim": self._output_dim,
            "position_score": score,
            "key_dim": self._key_dim,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "attention_span": (
                None if self.attention_span is None else keras.saving.serialize_keras_object(self.attention_span)
            ),
        }
        config.update({name: resolved[name] if name in resolved else getattr(self, name) for name in _ARGUMENTS})
        return config


def _axis_window_keys(neighbourhood):
    """The row and column windows' keys of a 2-D window (`Neighbourhood.axis_window_keys`); None: no such window.

    A peaked position score takes them to peak in each query's window (a far center's nearest key
    may be outside it). A 1-D window over the token sequence is no product of axis windows: its
    scores peak over all keys, as without a window.
    """
    if neighbourhood is None or neighbourhood.flat:
        return None
    return neighbourhood.axis_window_keys()


def _returned_scores(mode, probabilities, neighbourhood, batch):
    """What ``return_attention_scores=True`` returns from the probabilities of a path (see the class docstring)."""
    if mode == "separable":
        rows, columns = probabilities
        scores = (
            separable_probabilities(rows, columns)
            if neighbourhood is None
            else separable_window_entries(rows, columns, neighbourhood.key_indices)
        )
    elif neighbourhood is None:
        scores = probabilities
    elif mode.startswith("windowed"):
        scores = window_probabilities(probabilities, neighbourhood)
    else:
        scores = window_entries(probabilities, neighbourhood.key_indices)
    scores = per_example(scores, batch)
    return scores if neighbourhood is None else (scores, ops.convert_to_tensor(neighbourhood.key_indices))


def _check_arguments(num_heads, output_dim, key_dim, dropout, content_scale, terms, position_score, separable, **flags):
    """ValueError naming the argument for the constructor arguments that need no other part of the layer."""
    check_positive_int("num_heads", num_heads)
    for name, value in (("output_dim", output_dim), ("key_dim", key_dim)):
        if value is not None:
            check_positive_int(name, value)
    check_rate("dropout", dropout)
    if content_scale is not None:
        check_positive_number("content_scale", content_scale)
    for name, value in {**terms, **flags}.items():
        check_bool(name, value)
    if not any(terms.values()):
        raise ValueError(f"At least one score term must be on. Received: {terms}")
    needs_positions = terms["use_content_position"] or terms["use_position_bias"]
    if needs_positions and position_score is None:
        raise ValueError(
            "`position_score` is required when use_content_position or use_position_bias is on. "
            "Received: position_score=None"
        )
    if needs_positions and isinstance(position_score, str):  # built in build(), checked now
        position_score_class(position_score)
    if separable not in ("auto", True, False):
        raise ValueError(f"`separable` must be 'auto', True or False. Received: separable={separable!r}")
