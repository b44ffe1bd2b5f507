"""The windowed (neighbourhood) path of `RelativeMultiHeadAttention`: eq. (8) on tiles of queries.

Each tile of ``Bq`` queries attends to the region of ``Rk`` keys that holds
all their windows (`keras_attnconv.layers.neighbourhood`); scores of keys
outside a query's window are -inf. Tensors in the tile layout are
``(batch, tiles, Bq, heads, Rk)``: every product is a matmul batched over
(batch, tile) whose rows are (query, head), so no transposes of per-head
tensors are needed. Cost per channel and head: ``tiles * Bq * Rk`` pairs,
``O(T K^2)``; memory likewise, never a (T, T) table.

Which wide tensor is gathered into regions matters more than FLOPs: a region
repeats its keys for ``~(Rk / Bq)`` tiles. The values are the input itself
(the paper's ``D_h = D_in``), so the input ``X`` (batch, T, C) is gathered
once and serves as the values; the content-content term is then computed as
``(q Wk^T) . X_k`` when ``C <= key_dim`` (no per-head key tensor is gathered;
``q . b_k`` is the same for every key of a query and drops out of the
softmax), else as ``q . k`` on a gathered region of keys (batch, T, heads,
key_dim). Scores and softmax are float32; projections and contractions run
in the compute dtype.
"""

import functools

import keras
import numpy as np
from keras import ops


def take_tokens(tokens, index):
    """``tokens[:, index]`` for (batch, T, C) tokens: (batch, *index.shape, C), laid out as it is indexed.

    A gather of whole rows from the (batch * T, C) tokens. `ops.take` along axis 1 gathers with the
    batch inside each row instead, and XLA then copies the result into the batch-major layout the
    matmuls need: one more region-sized buffer (content attention, 9 heads, C = key_dim = 400,
    batch 2, 64x64 tokens, 7x7 window: the compiled training step took 516 instead of 398 MiB).
    """
    length, channels = tokens.shape[1], tokens.shape[2]
    first_rows = ops.arange(ops.shape(tokens)[0], dtype="int32") * length
    rows = ops.reshape(first_rows, (-1,) + (1,) * index.ndim) + index
    return ops.take(ops.reshape(tokens, (-1, channels)), rows, axis=0)


def window_probabilities(probabilities, neighbourhood):
    """Tile probabilities -> the probabilities of every query's window keys.

    Args:
        probabilities: (batch, tiles, Bq, heads, Rk), or (tiles, Bq, heads, Rk) for position-only heads.

    Returns:
        (batch, heads, T, K*K), or (heads, T, K*K), in the order of `Neighbourhood.key_indices`.
    """
    if ops.ndim(probabilities) == 4:
        flat = ops.reshape(ops.transpose(probabilities, (2, 0, 1, 3)), (probabilities.shape[2], -1))
        return ops.take(flat, neighbourhood.window_slot_index, axis=1)
    batch_flat = ops.transpose(probabilities, (0, 3, 1, 2, 4))  # (batch, heads, tiles, Bq, Rk)
    flat = ops.reshape(batch_flat, (-1, probabilities.shape[3], int(np.prod(probabilities.shape[1:3]))
                                    * probabilities.shape[-1]))
    return ops.take(flat, neighbourhood.window_slot_index, axis=2)


class WindowedAttention:
    """The windowed path, as methods of `RelativeMultiHeadAttention` (which inherits them)."""

    def _call_windowed(self, tokens, neighbourhood, training):
        """(probabilities before dropout, outputs before the bias) on the tiled windowed path.

        Two pieces around the dropout (whose random draw must not be repeated): with
        `rematerialize`, each is recomputed in the backward pass from the tokens, regions and
        per-head (batch, T, heads, C) tensors included; only the probabilities are kept. Without
        it, XLA computes the key regions the two pieces gather once.
        """
        piece = keras.remat if self.rematerialize else (lambda function: function)
        probabilities = piece(functools.partial(self._windowed_probabilities, neighbourhood))(tokens)
        dropped = self.dropout_layer(probabilities, training=training)
        return probabilities, piece(functools.partial(self._windowed_outputs, neighbourhood))(dropped, tokens)

    def _windowed_probabilities(self, neighbourhood, tokens):
        region = take_tokens(tokens, neighbourhood.region_index)
        return self._softmax(self._windowed_scores(tokens, region, neighbourhood))

    def _windowed_outputs(self, neighbourhood, probabilities, tokens):
        region = take_tokens(tokens, neighbourhood.region_index)
        return self._windowed_contraction(probabilities, region, neighbourhood)

    def _keys_from_inputs(self):
        """Whether the content-content term is ``(q Wk^T) . X_k`` on the input region (see the module docstring)."""
        return self.input_dim <= self.key_dim

    def _folds_queries(self, token_shape, neighbourhood):
        """Whether the queries are folded into the kernels that consume them: no (batch, T, heads, key_dim) queries.

        Content-content: ``s Wq_h Wk_h^T`` as one (C, heads, C) kernel against the input region
        (needs keys from the inputs). Content-position, for scores with per-axis shift tables
        (`LearnedRelativeScore.windowed_axis_scores`): ``s Wq_h E^T`` for the row and column tables
        ``E``, a (C, heads, shifts) kernel. Folded, a query costs ``C * heads * (C + shifts)``
        multiply-adds instead of ``C * heads * key_dim`` for its projection plus the terms'
        ``heads * key_dim * C`` and ``heads * axis_dim * shifts``; forming the kernels costs about
        as much once per call, so the call must have more tokens (all examples: the batch when it is
        static, else one example) than the input has channels.

        Args:
            token_shape: (batch or None, T, C), the shape of the tokens.
        """
        content_content, content_position = self.use_content_content, self.use_content_position
        batch, tokens = token_shape[0] or 1, token_shape[1]
        if not (content_content or content_position) or batch * tokens <= self.input_dim:
            return False
        if content_content and not self._keys_from_inputs():
            return False
        shifts = 0
        if content_position:
            if self.position_key_projection or not hasattr(self.position_score, "windowed_axis_scores"):
                return False
            shifts = sum(neighbourhood.axis_shift_counts)
        channels, heads, key_dim = self.input_dim, self.num_heads, self.key_dim
        folded = channels * heads * ((channels if content_content else 0) + shifts)
        unfolded = channels * heads * key_dim + (heads * key_dim * channels if content_content else 0)
        if content_position:
            unfolded += heads * self.position_score.axis_dim * shifts
        return folded < unfolded

    def _windowed_scores(self, tokens, region, neighbourhood):
        """Attention scores of the tile pairs, float32, -inf outside each query's window.

        Args:
            tokens: (batch, T, C) in the compute dtype.
            region: the tokens of every tile's key region, (batch, tiles, Rk, C).
            neighbourhood: the grid's `Neighbourhood`.

        Returns:
            (batch, tiles, Bq, heads, Rk), or (tiles, Bq, heads, Rk) for position-only heads.
        """
        mask = neighbourhood.mask[:, :, None, :]  # (tiles, Bq, 1, Rk)
        position = self._window_position_terms(neighbourhood)
        if not self.uses_content:
            return ops.where(mask, position, -np.inf)
        content = self._window_content_terms(tokens, region, neighbourhood)
        scores = content if position is None else content + position[None]
        if not (self.use_content_content or self.use_content_position or position is not None):
            # The key bias alone scores keys, not (query, key) pairs: give every query its row.
            scores = ops.broadcast_to(scores, (ops.shape(tokens)[0], *mask.shape[:2], self.num_heads, mask.shape[-1]))
        return ops.where(mask[None], scores, -np.inf)

    def _window_position_terms(self, neighbourhood):
        """Position bias plus attention span of every tile pair, float32 (tiles, Bq, heads, Rk), or None.

        Both are read per distinct shift (a (heads, 2H-1, 2W-1) table for the score) and gathered.
        """
        terms = None
        if self.use_position_bias:
            table = ops.cast(self.position_score.shift_scores(neighbourhood.height, neighbourhood.width), "float32")
            terms = ops.take(ops.reshape(table, (self.num_heads, -1)), neighbourhood.shift_index, axis=1)
        if self.attention_span is not None:
            span = self.attention_span.window_score_bias(neighbourhood)
            terms = span if terms is None else terms + span
        return None if terms is None else ops.transpose(terms, (1, 2, 0, 3))

    def _window_content_terms(self, tokens, region, neighbourhood):
        """The data-dependent terms of eq. (8) on the tile pairs: float32 (batch, tiles, Bq or 1, heads, Rk)."""
        dtype = tokens.dtype
        scale = ops.cast(self._scale, dtype)
        content = 0.0
        fold = self._folds_queries(tokens.shape, neighbourhood)
        if self.use_content_content or self.use_content_position:
            query_tokens = take_tokens(tokens, neighbourhood.query_index)  # (batch, tiles, Bq, C)
        if (self.use_content_position or self.use_content_content) and not fold:
            queries = ops.einsum("bnic,chd->bnihd", query_tokens, self.query_kernel)
            if self.query_bias is not None:
                queries = queries + self.query_bias
            queries = queries * scale  # scaled once, as on the global path
        if self.use_content_content or self.use_key_bias:
            if self._keys_from_inputs():
                if self.use_content_content:
                    if fold:
                        # s Wq_h Wk_h^T as one (C, heads, C) kernel: no (batch, T, heads, key_dim) queries at all.
                        kernel = ops.einsum("chd,ehd->che", self.query_kernel, self.key_kernel) * scale
                        key_queries = ops.einsum("bnic,che->bnihe", query_tokens, kernel)
                        if self.query_bias is not None:
                            bias = ops.einsum("hd,ehd->he", self.query_bias, self.key_kernel)
                            key_queries = key_queries + bias * scale
                    else:
                        key_queries = ops.einsum("bnihd,chd->bnihc", queries, self.key_kernel)
                    content = content + ops.cast(ops.einsum("bnihc,bnrc->bnihr", key_queries, region), "float32")
                if self.use_key_bias:
                    key_vectors = ops.einsum("chd,hd->ch", self.key_kernel, ops.cast(self.u, dtype))
                    key_bias = ops.einsum("bnrc,ch->bnhr", region, key_vectors)
                    content = content + ops.cast(key_bias * scale, "float32")[:, :, None]
                if self.key_bias is not None:
                    folded_queries = fold and self.use_content_content
                    content = content + self._key_bias_constants(
                        query_tokens if folded_queries else None,
                        queries if self.use_content_content and not fold else None)
            else:
                keys = ops.einsum("btc,chd->bthd", tokens, self.key_kernel)
                if self.key_bias is not None:
                    keys = keys + self.key_bias
                key_region = ops.take(keys, neighbourhood.region_index, axis=1)  # (batch, tiles, Rk, heads, key_dim)
                if self.use_content_content:
                    content = content + ops.cast(ops.einsum("bnihd,bnrhd->bnihr", queries, key_region), "float32")
                if self.use_key_bias:
                    key_bias = ops.einsum("bnrhd,hd->bnhr", key_region, ops.cast(self.u, dtype))
                    content = content + ops.cast(key_bias * scale, "float32")[:, :, None]
        if self.use_content_position:
            score = self.position_score
            if fold:
                content = content + score.windowed_axis_scores(
                    lambda part, table: self._folded_per_shift_scores(query_tokens, part, table), neighbourhood)
            else:
                if self.position_key_projection:
                    position_queries = ops.einsum("bnihd,hde->bnihe", queries, self.position_key_kernel)
                else:
                    position_queries = queries[..., : score.encoding_dim]
                content = content + score.windowed_content_position_scores(position_queries, neighbourhood)
        return content

    def _folded_per_shift_scores(self, query_tokens, part, table):
        """``q_h[part] . e`` for every row ``e`` (a shift) of `table`, with ``q = s (X Wq + b_q)`` folded into a kernel.

        Returns (batch, tiles, Bq, heads, shifts) in the tokens' dtype. ``part`` picks the query channels
        that meet the table (`LearnedRelativeScore.windowed_axis_scores`).
        """
        dtype = query_tokens.dtype
        scale = ops.cast(self._scale, dtype)
        table = ops.cast(table, dtype)
        kernel = ops.einsum("chd,sd->chs", self.query_kernel[..., part], table) * scale
        scores = ops.einsum("bnic,chs->bnihs", query_tokens, kernel)
        if self.query_bias is not None:
            scores = scores + ops.einsum("hd,sd->hs", self.query_bias[..., part], table) * scale
        return scores

    def _key_bias_constants(self, query_tokens, queries):
        """The key-projection bias's terms ``q . b_k`` and ``u . b_k``, float32 (batch, tiles, Bq, heads, 1) or less.

        They are the same for every key of a query, so the softmax ignores them; they are added
        (cheaply: no key axis) so that the bias gets its (zero) gradient, as on the global path,
        instead of none at all.
        """
        key_bias, dtype = self.key_bias, self.compute_dtype
        scale = ops.cast(self._scale, dtype)
        total = 0.0
        if query_tokens is not None:  # folded queries: q . b_k = s (X_q Wq + b_q) . b_k
            per_query = ops.einsum("bnic,ch->bnih", query_tokens, ops.einsum("chd,hd->ch", self.query_kernel, key_bias))
            if self.query_bias is not None:
                per_query = per_query + ops.einsum("hd,hd->h", self.query_bias, key_bias)
            total = total + ops.cast(per_query * scale, "float32")[..., None]
        elif queries is not None:
            total = total + ops.cast(ops.einsum("bnihd,hd->bnih", queries, key_bias), "float32")[..., None]
        if self.use_key_bias:
            total = total + ops.cast(ops.einsum("hd,hd->h", ops.cast(self.u, dtype), key_bias) * scale,
                                     "float32")[:, None]
        return total

    def _windowed_contraction(self, probabilities, region, neighbourhood):
        """``sum_h P_h X W_h`` for every query, in token order: (batch, T, output_dim) in the region's dtype.

        `probabilities` are the (dropped-out) tile probabilities of `windowed_scores`; the
        contraction over keys carries the input channels, then the merged value/output kernel
        maps each query's heads to the outputs before the queries leave the tile layout.
        """
        probabilities = ops.cast(probabilities, region.dtype)
        equation = "nihr,bnrc->bnihc" if ops.ndim(probabilities) == 4 else "bnihr,bnrc->bnihc"
        context = ops.einsum(equation, probabilities, region)
        outputs = ops.einsum("bnihc,hco->bnio", context, self.output_kernel)
        tiles, queries = neighbourhood.query_index.shape
        outputs = ops.reshape(outputs, (-1, tiles * queries, outputs.shape[-1]))
        return take_tokens(outputs, neighbourhood.untile_index)

    def windowed_multiply_adds(self, height, width):
        """Multiply-adds per example that the windowed path runs on a grid: ``(linear, attention)``.

        Counted product by product as the methods above compute them: every query slot of the
        tiles (``tiles * Bq``, a short tile repeats its last query) against every key of its
        region (``Rk``, masked keys included), with the queries folded into the kernels where
        `_folds_queries` folds them (for one example). ``linear``: products with weights or
        kernels made from weights only; ``attention``: the rest. Products that do not depend on
        the example (position-only scores, folded kernels) are shared by the batch and not counted.
        """
        neighbourhood = self.neighbourhood(height, width)
        heads, channels, key_dim = self.num_heads, self.input_dim, self.key_dim
        tiles, region = neighbourhood.region_index.shape
        query_slots = neighbourhood.query_index.size
        fold = self._folds_queries((1, height * width, channels), neighbourhood)
        queries_needed = self.use_content_content or self.use_content_position
        keys_needed = self.use_content_content or self.use_key_bias
        linear = query_slots * heads * channels * self.output_dim  # the merged value/output kernel
        attention = neighbourhood.tile_pairs * heads * channels  # probabilities x the input region
        if queries_needed and not fold:
            linear += query_slots * channels * heads * key_dim
        if keys_needed and self._keys_from_inputs():
            if self.use_content_content:
                linear += query_slots * heads * channels * (channels if fold else key_dim)  # q Wk^T
                attention += neighbourhood.tile_pairs * heads * channels
            if self.use_key_bias:
                attention += tiles * region * channels * heads
            if self.key_bias is not None and self.use_content_content:
                attention += query_slots * heads * (channels if fold else key_dim)
        elif keys_needed:
            linear += height * width * channels * heads * key_dim
            if self.use_content_content:
                attention += neighbourhood.tile_pairs * heads * key_dim
            if self.use_key_bias:
                attention += tiles * region * heads * key_dim
        if self.use_content_position:
            score = self.position_score
            if self.position_key_projection:
                linear += query_slots * heads * key_dim * score.encoding_dim
            attention += heads * score.windowed_content_position_multiply_adds(
                neighbourhood, channels if fold else None)
        return linear, attention
