"""Multi-head self-attention over pixels with relative position scores, eq. (8)."""

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.attention_span import AttentionSpan
from keras_attnconv.layers.fan_in_uniform import initializer_for
from keras_attnconv.layers.neighbourhood import get_neighbourhood, window_arguments
from keras_attnconv.layers.path_rule import prefers_separable, prefers_windowed
from keras_attnconv.layers.position_score_factory import POSITION_SCORES, get_position_score
from keras_attnconv.layers.validation import get_initializer, grid_size, real_inputs
from keras_attnconv.layers.windowed_attention import WindowedAttention, window_probabilities
from keras_attnconv.utils.checks import check_bool, check_choice, check_positive_int, check_positive_number, check_rate

_TERMS = ("use_content_content", "use_content_position", "use_key_bias", "use_position_bias")


@keras.saving.register_keras_serializable(package="keras_attnconv")
class RelativeMultiHeadAttention(WindowedAttention, keras.layers.Layer):
    """Self-attention over the pixels of a feature map, eq. (8) of the paper.

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
    shape ``(num_heads, input_dim, output_dim)`` applied to the concatenated
    heads. With only the position bias on, the attention probabilities do not
    depend on the input: they are computed once per call, shape
    ``(heads, H*W, H*W)``, and applied to the whole batch (attention dropout
    then drops the same links for every example of the batch).

    Scores and softmax are computed in float32 under any dtype policy; the
    projections and the attention contraction run in the compute dtype.

    Args:
        num_heads: int, number of heads.
        output_dim: int or None, output channels (default: input channels).
        position_score: name (``"quadratic"``, ``"gaussian"``, ``"learned"``),
            a `PositionScore` layer, or its serialized config; None when no
            position term is used. Names are built with ``num_heads`` heads
            and ``key_dim`` (see `get_position_score`).
        use_content_content: bool, term ``X_q Wq Wk^T X_k``.
        use_content_position: bool, term ``X_q Wq W_hat r_delta``.
        use_key_bias: bool, term ``u^T Wk X_k``.
        use_position_bias: bool, term ``v^T r_delta``.
        key_dim: int or None, query/key size per head (default: input channels).
        content_scale: float or None, ``s`` above; None means ``1/sqrt(key_dim)``.
        position_key_projection: bool, learn ``W_hat`` instead of the padded
            identity.
        dropout: float in [0, 1), dropout on attention probabilities.
        use_bias: bool, biases on the query/key projections and the output.
        kernel_initializer, bias_initializer: initializers of the projections.
        separable: ``"auto"``, True or False. Position-only heads whose scores
            are a row term plus a column term (quadratic, learned, diagonal
            Gaussian) have probabilities ``R_h (x) C_h`` and are applied as a
            row pass and a column pass, ``O(HW(H + W))`` instead of
            ``O((HW)^2)`` per channel. "auto" uses that where it is faster on
            the device (`keras_attnconv.layers.path_rule`: on a CPU wherever
            it does fewer FLOPs, on a GPU/TPU above 1024 tokens); True forces
            it, False forces the general path (the eq. (8) reference). With
            attention dropout the row and column links are dropped
            independently. `attention_mode` reports the path taken.
        attention_span: None, an `AttentionSpan` layer, a dict of its
            arguments (``{"threshold": 0.1, "initial_sigma": 4.0}``; built
            with ``num_heads``) or its serialized config. A learned per-head
            Gaussian window added (as ``log g``) to the scores of any score
            function, keys under its threshold masked. A span without a
            threshold keeps separable heads separable. A span with a
            ``max_window`` gives the layer that window (see ``window``).
        window: None (global attention), or an odd int or (odd, odd) pair
            ``(Kh, Kw)``: neighbourhood (local) attention, each query attends
            to a ``Kh x Kw`` window of keys with NATTEN's rule (see
            `keras_attnconv.layers.neighbourhood`): the window is shifted to
            stay inside the map, so every query has exactly ``Kh * Kw`` keys,
            and the position terms use the true shifts. A side longer than
            the map (dilation 1) is clipped to the map. The windowed path
            costs ``O(H W Kh Kw)`` per channel and head and never forms a
            (T, T) tensor (T = H*W).
        dilation: positive int or pair, the window's dilation (NATTEN's rule:
            each axis is split into ``dilation`` interleaved groups by index
            mod dilation and the window is taken within the group);
            ``window * dilation`` must not exceed the map's side.
        windowed: ``"auto"``, True or False, for layers with a window. "auto"
            picks the windowed (tiled) path where it is cheaper than global
            attention with the window as a mask
            (`keras_attnconv.layers.path_rule.prefers_windowed`), and keeps
            separable position-only heads separable (the window is a row
            window times a column window) where that path is preferred; True
            forces the windowed path, False forces the global path with an
            additive -inf mask outside the windows (the reference).
        rematerialize: bool, on the windowed path, recompute the per-head
            ``(batch, T, heads, C)`` tensors of the scores and of the context
            in the backward pass (`keras.remat`) instead of keeping them from
            the forward pass: only the ``(batch, heads, T, window keys)``
            probabilities are kept. Saves memory in deep models, whose layers
            would each keep theirs until the backward pass reaches them (not
            in a single layer, whose backward pass needs them at once anyway;
            `attnconv bench` measures it on 64x64 images), for about one more
            forward pass of the attention. No effect on other paths.

    Call arguments:
        inputs: tensor (batch, H, W, C) with static H, W, C; integer inputs
            (e.g. uint8 pixels) are cast to the compute dtype, as values.
        training: bool, whether dropout is active.
        return_attention_scores: bool, also return the attention probabilities
            (before dropout), float32 (batch, heads, H*W, H*W). With a window:
            the pair ``(probabilities, key_indices)``: probabilities float32
            (batch, heads, T, K) of every query's ``K = Kh * Kw`` window keys,
            and key_indices int32 (T, K), the flat (row-major, ``i * W + j``)
            position of each of those keys; a query's keys are listed in
            row-major window order. ``probabilities[b, h, q, s]`` is the
            weight of key ``key_indices[q, s]`` for query ``q``; every other
            key has weight 0.

    Returns:
        Tensor (batch, H, W, output_dim), or ``(output, scores)`` with the
        scores above.

    Example:
    >>> layer = RelativeMultiHeadAttention(num_heads=9, position_score="quadratic")
    >>> layer(keras.ops.ones((2, 8, 8, 16))).shape
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
        check_positive_int("num_heads", num_heads)
        for name, value in (("output_dim", output_dim), ("key_dim", key_dim)):
            if value is not None:
                check_positive_int(name, value)
        check_rate("dropout", dropout)
        if content_scale is not None:
            check_positive_number("content_scale", content_scale)
        flags = {"use_content_content": use_content_content, "use_content_position": use_content_position,
                 "use_key_bias": use_key_bias, "use_position_bias": use_position_bias,
                 "position_key_projection": position_key_projection, "use_bias": use_bias}
        for name, value in flags.items():
            check_bool(name, value)
        terms = dict(zip(_TERMS, (use_content_content, use_content_position, use_key_bias, use_position_bias)))
        if not any(terms.values()):
            raise ValueError(f"At least one score term must be on. Received: {terms}")
        needs_positions = use_content_position or use_position_bias
        if needs_positions and position_score is None:
            raise ValueError(
                "`position_score` is required when use_content_position or use_position_bias is on. "
                "Received: position_score=None"
            )
        if needs_positions and isinstance(position_score, str):  # built in build(), checked now
            check_choice("position_score", position_score, sorted(POSITION_SCORES))
        if separable not in ("auto", True, False):
            raise ValueError(f"`separable` must be 'auto', True or False. Received: separable={separable!r}")
        self.num_heads = int(num_heads)
        # The arguments, as given (None: the input channels); the `output_dim` and `key_dim` properties resolve them.
        self._output_dim = output_dim
        self._key_dim = key_dim
        self.input_dim = None  # set by build()
        self.use_content_content = use_content_content
        self.use_content_position = use_content_position
        self.use_key_bias = use_key_bias
        self.use_position_bias = use_position_bias
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
            self._check_score_layer(self.position_score)
        self.separable = separable
        score = self.position_score or POSITION_SCORES.get(self._position_score_name)
        if separable is True and not self.uses_content and not score.separable:
            raise ValueError(f"{getattr(score, '__name__', type(score).__name__)} scores are not separable by axis. "
                             "Received: separable=True")
        self.attention_span = self._make_attention_span(attention_span)
        self.window, self.dilation = window_arguments(window, dilation)
        self._check_window_arguments(windowed)
        self.windowed = windowed
        check_bool("rematerialize", rematerialize)
        self.rematerialize = rematerialize
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype="float32")
        # The separable path drops row and column links independently, each with the rate that
        # keeps a (query, key) link with probability 1 - dropout, as the general path does.
        self.axis_dropout_layer = keras.layers.Dropout(1.0 - (1.0 - self.dropout) ** 0.5, dtype="float32")
        self._attention_mode = None

    def _check_score_layer(self, layer):
        if layer.num_heads != self.num_heads:
            raise ValueError(
                f"The position score has {layer.num_heads} heads but the attention has "
                f"num_heads={self.num_heads}."
            )
        if layer.head_vectors != self.use_position_bias:
            raise ValueError(
                f"A position score with head_vectors={layer.head_vectors} does not fit "
                f"use_position_bias={self.use_position_bias}: its per-head vectors v are the "
                "position-bias term."
            )

    def _make_attention_span(self, span):
        if span is None:
            return None
        if isinstance(span, dict):
            if "class_name" in span:
                span = keras.saving.deserialize_keras_object(span)
            else:
                span = AttentionSpan(self.num_heads, **span)
        if not isinstance(span, AttentionSpan):
            raise ValueError("`attention_span` must be None, an AttentionSpan, or a dict of its arguments. "
                             f"Received: attention_span={span!r}")
        if span.num_heads != self.num_heads:
            raise ValueError(f"The attention span has {span.num_heads} heads but the attention has "
                             f"num_heads={self.num_heads}.")
        return span

    def _check_window_arguments(self, windowed):
        if windowed not in ("auto", True, False):
            raise ValueError(f"`windowed` must be 'auto', True or False. Received: windowed={windowed!r}")
        span_window = self.attention_span.window if self.attention_span is not None else None
        if span_window is not None and self.window is not None and span_window != (self.window, (1, 1), False):
            raise ValueError(
                f"The attention span's max_window={self.attention_span.max_window} (span_dims="
                f"{self.attention_span.span_dims}) differs from the layer's window. Received: window={self.window}")
        if windowed is True and self.window is None and span_window is None:
            raise ValueError("`windowed=True` needs a `window` (or an attention span with `max_window`). "
                             "Received: windowed=True, window=None")
        if windowed is True and self.separable is True:
            raise ValueError("`windowed=True` and `separable=True` force two different paths. "
                             "Received: windowed=True, separable=True")

    @property
    def window_spec(self):
        """``(window, dilation, flat)`` of the neighbourhood the layer attends in, or None (global attention).

        The layer's ``window``, else the ``max_window`` of its attention span (``flat``: a 1-D window
        over the row-major tokens, from a 1-D span).
        """
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
        return self.use_content_content or self.use_content_position or self.use_key_bias

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
        """The path taken on a ``height x width`` grid.

        Args:
            height, width: the grid.
            platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``; None means the device
                the backend computes on (see `keras_attnconv.layers.path_rule`).

        Returns:
            ``"content"`` (probabilities per example), ``"position"`` (one
            (heads, T, T) probability tensor per call, shared by the batch),
            ``"separable"`` (a row pass and a column pass per head; with a
            window, each axis masked outside its window), or, with a window,
            ``"windowed_content"`` / ``"windowed_position"`` (the tiled
            neighbourhood path, per example / shared by the batch). With a
            window, "content" and "position" are global attention with the
            window as a mask.
        """
        neighbourhood = self.neighbourhood(height, width)
        if neighbourhood is not None and self.windowed is not False:
            windowed = self.windowed is True or prefers_windowed(neighbourhood, platform)
        else:
            windowed = False
        if self.uses_content:
            return "windowed_content" if windowed else "content"
        if self.separable is False:
            return "windowed_position" if windowed else "position"
        span_separable = self.attention_span is None or self.attention_span.separable
        window_separable = neighbourhood is None or not neighbourhood.flat
        if not (self.position_score.separable and span_separable and window_separable):
            if self.separable is True:
                reason = (f"{type(self.position_score).__name__} scores are" if not self.position_score.separable
                          else "A 1-D window is" if not window_separable
                          else "An attention span with a threshold, a max_window (or 1-D) is")
                raise ValueError(f"{reason} not separable by axis. Received: separable=True")
            return "windowed_position" if windowed else "position"
        if self.separable is True or (self.windowed is not True and prefers_separable(height, width, platform)):
            return "separable"
        return "windowed_position" if windowed else "position"

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
                self._position_score_name, self.num_heads, key_dim=self.key_dim,
                head_vectors=self.use_position_bias, dtype="float32",
            )
        for part in (self.position_score, self.attention_span):
            if part is not None and not part.built:
                part.build(input_shape)

        needs_query = self.use_content_content or self.use_content_position
        needs_key = self.use_content_content or self.use_key_bias
        head_shape = (self.num_heads, self.key_dim)
        if needs_query:
            self.query_kernel = self._kernel("query_kernel", (self.input_dim, *head_shape), self.input_dim)
            self.query_bias = self._bias("query_bias", head_shape, self.input_dim)
        if needs_key:
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
                    f"The content-position term with the identity W_hat needs encoding_dim <= key_dim; "
                    f"got encoding_dim={encoding_dim}, key_dim={self.key_dim}. Use "
                    "position_key_projection=True or a larger key_dim."
                )
        # The merged value/output kernel is one linear map of the heads' concatenated contexts.
        contexts = self.num_heads * self.input_dim
        self.output_kernel = self._kernel("output_kernel", (self.num_heads, self.input_dim, self.output_dim), contexts)
        self.output_bias = self._bias("output_bias", (self.output_dim,), contexts)
        self._attention_mode = self.attention_mode_for(height, width)

    def _kernel(self, name, shape, fan_in):
        """A kernel of the products with `fan_in` inputs (which a `FanInUniform` initializer bounds by)."""
        return self.add_weight(name=name, shape=shape, initializer=initializer_for(self.kernel_initializer, fan_in))

    def _bias(self, name, shape, fan_in):
        if not self.use_bias:
            return None
        return self.add_weight(name=name, shape=shape, initializer=initializer_for(self.bias_initializer, fan_in))

    def _project(self, tokens, kernel, bias):
        projected = ops.einsum("btc,chd->bthd", tokens, kernel)
        return projected if bias is None else projected + bias

    def _scores(self, tokens, height, width):
        """Attention scores, float32: (heads, T, T) if position-only, else (batch, heads, T, T).

        With a window (global path), -inf outside each query's window.
        """
        scores = self._unmodulated_scores(tokens, height, width)
        neighbourhood = self.neighbourhood(height, width)
        window_mask = None if neighbourhood is None else neighbourhood.window_mask()
        if self.attention_span is not None:
            scores = self.attention_span.modulate(scores, height, width, window_mask)
        if window_mask is not None:
            scores = ops.where(window_mask, scores, -np.inf)
        return scores

    def _unmodulated_scores(self, tokens, height, width):
        """The four terms of eq. (8), float32, before any attention span."""
        position = None
        if self.use_position_bias:
            position = ops.cast(self.position_score.position_scores(height, width), "float32")
            if not self.uses_content:
                return position
        content = 0.0
        if self.use_content_content or self.use_content_position:
            # Scale the queries once instead of every (T x T) score matrix.
            queries = self._project(tokens, self.query_kernel, self.query_bias) * ops.cast(self._scale, tokens.dtype)
        if self.use_content_content or self.use_key_bias:
            keys = self._project(tokens, self.key_kernel, self.key_bias)
        if self.use_content_content:
            content = content + ops.cast(ops.einsum("bqhd,bkhd->bhqk", queries, keys), "float32")
        if self.use_key_bias:
            key_bias = ops.einsum("bkhd,hd->bhk", keys, ops.cast(self.u, keys.dtype))
            content = content + ops.cast(key_bias * ops.cast(self._scale, keys.dtype), "float32")[:, :, None, :]
        if self.use_content_position:
            if self.position_key_projection:
                position_queries = ops.einsum("bthd,hde->bthe", queries, self.position_key_kernel)
            else:
                position_queries = queries[..., : self.position_score.encoding_dim]
            content = content + self.position_score.content_position_scores(position_queries, height, width)
        if position is not None:
            return content + position[None]
        if not (self.use_content_content or self.use_content_position):
            # The key bias alone scores keys, not (query, key) pairs: give every query its row.
            tokens_count = height * width
            content = ops.broadcast_to(content, (ops.shape(tokens)[0], self.num_heads, tokens_count, tokens_count))
        return content

    def call(self, inputs, training=None, return_attention_scores=False):
        # Keras autocasts floating inputs only; integer images are cast here, as values.
        inputs = real_inputs(inputs, self.compute_dtype)
        height, width = grid_size(inputs.shape)
        mode = self.attention_mode_for(height, width)
        if mode == "separable":
            return self._call_separable(inputs, height, width, training, return_attention_scores)
        tokens = ops.reshape(inputs, (-1, height * width, self.input_dim))
        neighbourhood = self.neighbourhood(height, width)
        if mode.startswith("windowed"):
            probabilities, outputs = self._call_windowed(tokens, neighbourhood, training)
        else:
            probabilities = self._softmax(self._scores(tokens, height, width))
            dropped = self.dropout_layer(probabilities, training=training)
            outputs = self._attend(ops.cast(dropped, tokens.dtype), tokens)
        if self.output_bias is not None:
            outputs = outputs + self.output_bias
        outputs = ops.reshape(outputs, (-1, height, width, self.output_dim))
        if not return_attention_scores:
            return outputs
        if neighbourhood is None:
            return outputs, _per_example(probabilities, inputs)
        if mode.startswith("windowed"):
            window = window_probabilities(probabilities, neighbourhood)
        else:
            window = _window_entries(probabilities, neighbourhood)
        return outputs, (_per_example(window, inputs), ops.convert_to_tensor(neighbourhood.key_indices))

    def _softmax(self, scores):
        # Position-only scores keep far-away centers' gradients exact through `_position_softmax`.
        return ops.softmax(scores, axis=-1) if self.uses_content else _position_softmax(scores)

    def _call_separable(self, inputs, height, width, training, return_attention_scores):
        """Position-only separable heads: P_h = R_h (x) C_h, applied as a row pass then a column pass."""
        row_scores, column_scores = self.position_score.axis_scores(height, width)
        if self.attention_span is not None:
            row_span, column_span = self.attention_span.axis_log_modulation(height, width)
            row_scores, column_scores = row_scores + row_span, column_scores + column_span
        neighbourhood = self.neighbourhood(height, width)
        if neighbourhood is not None:
            # The window is a row window times a column window: mask each axis outside its own.
            row_mask, column_mask = neighbourhood.axis_masks()
            row_scores = ops.where(row_mask, row_scores, -np.inf)
            column_scores = ops.where(column_mask, column_scores, -np.inf)
        rows = _position_softmax(row_scores)  # (heads, H, H)
        columns = _position_softmax(column_scores)  # (heads, W, W)
        dtype = inputs.dtype
        r = ops.cast(self.axis_dropout_layer(rows, training=training), dtype)
        c = ops.cast(self.axis_dropout_layer(columns, training=training), dtype)
        # One head at a time: the intermediates are (batch, H, W, channels), not (batch, H, W, heads,
        # channels), so they stay in cache and need no transposes; same FLOPs as all-heads einsums.
        values_first = self._values_first(height + width)
        outputs = None
        for head in range(self.num_heads):
            kernel = self.output_kernel[head]
            if values_first:
                head_outputs = _row_column_pass(r[head], c[head], ops.matmul(inputs, kernel))
            else:
                head_outputs = ops.matmul(_row_column_pass(r[head], c[head], inputs), kernel)
            outputs = head_outputs if outputs is None else outputs + head_outputs
        if self.output_bias is not None:
            outputs = outputs + self.output_bias
        if not return_attention_scores:
            return outputs
        if neighbourhood is not None:
            # Each window key's probability is its row factor times its column factor.
            query_rows, query_columns = np.divmod(np.arange(height * width)[:, None], width)
            key_rows, key_columns = np.divmod(neighbourhood.key_indices, width)
            window = (ops.take(ops.reshape(rows, (self.num_heads, -1)), query_rows * height + key_rows, axis=1)
                      * ops.take(ops.reshape(columns, (self.num_heads, -1)), query_columns * width + key_columns,
                                 axis=1))
            return outputs, (_per_example(window, inputs), ops.convert_to_tensor(neighbourhood.key_indices))
        tokens = height * width
        probabilities = ops.reshape(rows[:, :, None, :, None] * columns[:, None, :, None, :],
                                    (self.num_heads, tokens, tokens))
        return outputs, _per_example(probabilities, inputs)

    def _values_first(self, keys_per_query):
        """Whether ``X W_h`` is formed before the contraction over keys (else after it).

        Both orders cost ``T*h*C*O`` for the projection; the contraction costs
        ``h*T*keys_per_query`` (``T`` in general, ``H + W`` when separable)
        times the width it carries, so it should carry the narrower of
        input_dim and output_dim. At equal widths the forward passes and the
        backward with the input's gradient cost the same either way; the
        backward without it (a layer on a model's input, the layer of
        `attnconv bench`) does one projection-sized product more when contexts
        go first and one contraction more when values go first.
        """
        if self.input_dim != self.output_dim:
            return self.input_dim > self.output_dim
        return self.input_dim > keys_per_query

    def _attend(self, probabilities, tokens):
        """``sum_h P_h X W_h``, contracting in the cheaper order for these shapes."""
        p = "hqk" if ops.ndim(probabilities) == 3 else "bhqk"
        if not self._values_first(probabilities.shape[-1]):
            context = ops.einsum(f"{p},bkc->bqhc", probabilities, tokens)
            return ops.einsum("bqhc,hco->bqo", context, self.output_kernel)
        values = ops.einsum("bkc,hco->bkho", tokens, self.output_kernel)
        return ops.einsum(f"{p},bkho->bqo", probabilities, values)

    def compute_output_shape(self, input_shape):
        output_dim = self._output_dim or input_shape[-1]
        return (*tuple(input_shape)[:-1], output_dim)

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False):
        output_shape = self.compute_output_shape(inputs.shape)
        outputs = keras.KerasTensor(output_shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return outputs
        tokens = inputs.shape[1] * inputs.shape[2]
        neighbourhood = self.neighbourhood(*grid_size(inputs.shape))
        if neighbourhood is not None:
            keys = neighbourhood.keys_per_query
            return outputs, (keras.KerasTensor((inputs.shape[0], self.num_heads, tokens, keys), dtype="float32"),
                             keras.KerasTensor((tokens, keys), dtype="int32"))
        scores = keras.KerasTensor((inputs.shape[0], self.num_heads, tokens, tokens), dtype="float32")
        return outputs, scores

    def get_config(self):
        config = super().get_config()
        score = self._position_score_name
        if score is None and self.position_score is not None:
            score = keras.saving.serialize_keras_object(self.position_score)
        config.update({
            "num_heads": self.num_heads,
            "output_dim": self._output_dim,
            "position_score": score,
            "use_content_content": self.use_content_content,
            "use_content_position": self.use_content_position,
            "use_key_bias": self.use_key_bias,
            "use_position_bias": self.use_position_bias,
            "key_dim": self._key_dim,
            "content_scale": self.content_scale,
            "position_key_projection": self.position_key_projection,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "separable": self.separable,
            "attention_span": (None if self.attention_span is None
                               else keras.saving.serialize_keras_object(self.attention_span)),
            "window": self.window,
            "dilation": self.dilation,
            "windowed": self.windowed,
            "rematerialize": self.rematerialize,
        })
        return config


def _position_softmax(scores):
    """Softmax of position scores, float32, with the row maximum subtracted inside the graph.

    Softmax does not change, but the gradient does numerically: for a head
    centered far away, scores are ~-alpha*|Delta|^2 with slopes of ~alpha*|Delta|
    per parameter, and float32's 1 - 6e-8 for a saturated probability would be
    multiplied by them. After the subtraction the dominant score is exactly 0
    with an exactly zero derivative.

    The derivative of the maximum is written out (the entries equal to it
    share it) with the count of those entries floored at 1: JAX's own
    derivative of ``max`` divides by that count, and under XLA the scores and
    their maximum may be computed in differently fused kernels, match nowhere
    and give 0/0 (seen with diagonal Gaussian scores). With no match the
    derivative is dropped, which softmax's shift invariance allows.
    """
    scores = ops.cast(scores, "float32")
    maximum = ops.stop_gradient(ops.max(scores, axis=-1, keepdims=True))
    # The derivative of max, spread over the entries equal to it, with the count floored at 1.
    ties = ops.cast(ops.stop_gradient(scores) == maximum, "float32")
    weights = ops.stop_gradient(ties / ops.maximum(ops.sum(ties, axis=-1, keepdims=True), 1.0))
    zero_valued = ops.where(ties > 0, scores - ops.stop_gradient(scores), 0.0)  # (-inf - -inf elsewhere)
    dominant = maximum + ops.sum(weights * zero_valued, axis=-1, keepdims=True)
    return ops.softmax(scores - dominant, axis=-1)


def _row_column_pass(rows, columns, x):
    """``y[b, i, j] = sum_{k, l} rows[i, k] columns[j, l] x[b, k, l]`` for x of shape (batch, H, W, C).

    Two batched matmuls on reshapes of x, with the small factor broadcast over
    the batch: no transposes of x, unlike the equivalent einsums (which XLA
    lowers with a transpose per pass; 32x32 layer of `attnconv bench`: 229
    vs 282 ms forward + backward).
    """
    batch = ops.shape(x)[0]
    height, width, channels = x.shape[1:]
    x = ops.matmul(ops.broadcast_to(rows, (batch, height, height)), ops.reshape(x, (batch, height, width * channels)))
    x = ops.matmul(ops.broadcast_to(columns, (batch * height, width, width)),
                   ops.reshape(x, (batch * height, width, channels)))
    return ops.reshape(x, (batch, height, width, channels))


def _window_entries(probabilities, neighbourhood):
    """The window keys' entries of (..., heads, T, T) probabilities: (..., heads, T, K), see `key_indices`."""
    heads, tokens = probabilities.shape[-3], probabilities.shape[-1]
    flat = ops.reshape(probabilities, ((-1, heads) if ops.ndim(probabilities) == 4 else (heads,)) + (tokens**2,))
    index = np.arange(tokens)[:, None] * tokens + neighbourhood.key_indices
    return ops.take(flat, index.astype("int32"), axis=-1)


def _per_example(probabilities, inputs):
    """Attention probabilities as (batch, heads, ...); position-only ones are shared by the batch."""
    if ops.ndim(probabilities) == 4:
        return probabilities
    return ops.broadcast_to(probabilities[None], (ops.shape(inputs)[0], *probabilities.shape))
