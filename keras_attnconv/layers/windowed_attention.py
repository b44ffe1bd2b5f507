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

`windowed_attention` is the path; the other functions are its pieces. Like
the paths of `keras_attnconv.layers.attention_paths`, they read no layer: the
weights come as a `ScoreWeights` bundle, the position score layer (whose
encoding the content-position term reads) and the dropout as arguments.
"""

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.attention_paths import ScoreWeights, position_queries, position_softmax, project


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
    flat = ops.reshape(
        batch_flat, (-1, probabilities.shape[3], int(np.prod(probabilities.shape[1:3])) * probabilities.shape[-1])
    )
    return ops.take(flat, neighbourhood.window_slot_index, axis=2)


def windowed_attention(
    tokens,
    neighbourhood,
    output_kernel,
    weights=ScoreWeights(),
    position_terms=None,
    position_score=None,
    dropout=None,
    rematerialize=False,
):
    """Eq. (8) restricted to every query's window, on tiles: the general path with -inf outside the windows.

    Args:
        tokens: (batch, T, C) in the compute dtype; they are also the values.
        neighbourhood: the grid's `Neighbourhood` (its tiles, regions and masks).
        output_kernel: (heads, C, output_dim), the merged value/output kernel.
        weights: `ScoreWeights` of the data-dependent terms; the default (none on) gives
            position-only heads, whose probabilities are computed once for the batch.
        position_terms: float32 (tiles, Bq, heads, Rk), the position bias and span of every tile
            pair (`window_position_terms`), or a function of no arguments that returns them: it
            is called where the scores are computed, so that with `rematerialize` they are
            recomputed in the backward pass rather than kept; or None. Keys outside the windows
            are masked here.
        position_score: the `PositionScore` whose encoding the content-position term reads
            (only needed with that term).
        dropout: None, or a callable applied to the float32 tile probabilities.
        rematerialize: recompute the per-head (batch, T, heads, C) tensors of the scores and of
            the context in the backward pass (`keras.remat`) instead of keeping them from the
            forward pass: only the probabilities are kept. Saves memory in deep models, whose
            layers would each keep theirs until the backward pass reaches them (not in a single
            layer, whose backward pass needs them at once anyway; `attnconv bench` measures it on
            64x64 images), for about one more forward pass of the attention.

    Returns:
        ``(outputs, probabilities)``: the outputs (batch, T, output_dim) in token order, in the
        dtype of `tokens`, before any output bias, and the float32 tile probabilities before
        dropout, (batch, tiles, Bq, heads, Rk) or (tiles, Bq, heads, Rk) for position-only heads
        (`window_probabilities` reads each query's window keys from them).

    Two pieces around the dropout (whose random draw must not be repeated): with
    `rematerialize`, each is recomputed in the backward pass from the tokens, regions and
    per-head (batch, T, heads, C) tensors included. Without it, XLA computes the key regions
    the two pieces gather once.
    """

    def tile_probabilities(tokens):
        region = take_tokens(tokens, neighbourhood.region_index)
        terms = position_terms() if callable(position_terms) else position_terms
        scores = windowed_scores(tokens, region, neighbourhood, weights, terms, position_score)
        # Position-only scores keep far-away centers' gradients exact through `position_softmax`.
        return ops.softmax(scores, axis=-1) if weights.uses_content else position_softmax(scores)

    def tile_outputs(probabilities, tokens):
        region = take_tokens(tokens, neighbourhood.region_index)
        return windowed_contraction(probabilities, region, neighbourhood, output_kernel)

    piece = keras.remat if rematerialize else (lambda function: function)
    probabilities = piece(tile_probabilities)(tokens)
    dropped = probabilities if dropout is None else dropout(probabilities)
    return piece(tile_outputs)(dropped, tokens), probabilities


def window_position_terms(neighbourhood, shift_scores=None, span_bias=None, axis_scores=None):
    """Position bias plus attention span of every tile pair, float32 (tiles, Bq, heads, Rk), or None.

    Args:
        neighbourhood: the grid's `Neighbourhood`.
        shift_scores: (heads, 2H-1, 2W-1), the position bias of every shift
            (`PositionScore.shift_scores`), gathered here for every tile pair; or None.
        span_bias: float32 (heads, tiles, Bq, Rk), an attention span's ``log g`` of the tile
            pairs (`AttentionSpan.window_score_bias`), or None.
        axis_scores: instead of `shift_scores`, a separable position bias as its row and column
            parts, (heads, H, H) and (heads, W, W) indexed by query and key
            (`PositionScore.peaked_axis_scores`, whose peak in each window is an exact 0).
    """
    terms = None
    if shift_scores is not None:
        table = ops.cast(shift_scores, "float32")
        terms = ops.take(ops.reshape(table, (table.shape[0], -1)), neighbourhood.shift_index, axis=1)
    elif axis_scores is not None:
        row_terms, column_terms = (
            ops.take(ops.reshape(ops.cast(table, "float32"), (table.shape[0], -1)), index, axis=1)
            for table, index in zip(axis_scores, neighbourhood.axis_pair_index)
        )
        terms = row_terms + column_terms
    if span_bias is not None:
        terms = span_bias if terms is None else terms + span_bias
    return None if terms is None else ops.transpose(terms, (1, 2, 0, 3))


def windowed_scores(tokens, region, neighbourhood, weights, position_terms=None, position_score=None):
    """Attention scores of the tile pairs, float32, -inf outside each query's window.

    Args:
        tokens: (batch, T, C) in the compute dtype.
        region: the tokens of every tile's key region, (batch, tiles, Rk, C).
        neighbourhood: the grid's `Neighbourhood`.
        weights, position_terms, position_score: see `windowed_attention`.

    Returns:
        (batch, tiles, Bq, heads, Rk), or (tiles, Bq, heads, Rk) for position-only heads.
    """
    mask = neighbourhood.mask[:, :, None, :]  # (tiles, Bq, 1, Rk)
    if not weights.uses_content:
        return ops.where(mask, position_terms, -np.inf)
    content = window_content_terms(tokens, region, neighbourhood, weights, position_score)
    scores = content if position_terms is None else content + position_terms[None]
    if not (weights.needs_queries or position_terms is not None):
        # The key bias alone scores keys, not (query, key) pairs: give every query its row.
        heads = weights.key_kernel.shape[1]
        scores = ops.broadcast_to(scores, (ops.shape(tokens)[0], *mask.shape[:2], heads, mask.shape[-1]))
    return ops.where(mask[None], scores, -np.inf)


def keys_from_inputs(weights):
    """Whether the content-content term is ``(q Wk^T) . X_k`` on the input region (see the module docstring)."""
    input_dim, _, key_dim = weights.key_kernel.shape
    return input_dim <= key_dim


def folds_queries(weights, token_shape, neighbourhood, position_score=None):
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
        weights: `ScoreWeights`.
        token_shape: (batch or None, T, C), the shape of the tokens.
        neighbourhood: the grid's `Neighbourhood`.
        position_score: the `PositionScore` of the content-position term, if it is on.
    """
    content_content, content_position = weights.use_content_content, weights.use_content_position
    batch, tokens, channels = token_shape[0] or 1, token_shape[1], token_shape[2]
    if not (content_content or content_position) or batch * tokens <= channels:
        return False
    if content_content and not keys_from_inputs(weights):
        return False
    shifts = 0
    if content_position:
        if weights.position_key_kernel is not None or not hasattr(position_score, "windowed_axis_scores"):
            return False
        shifts = sum(neighbourhood.axis_shift_counts)
    _, heads, key_dim = weights.query_kernel.shape
    folded = channels * heads * ((channels if content_content else 0) + shifts)
    unfolded = channels * heads * key_dim + (heads * key_dim * channels if content_content else 0)
    if content_position:
        unfolded += heads * position_score.axis_dim * shifts
    return folded < unfolded


def window_content_terms(tokens, region, neighbourhood, weights, position_score=None):
    """The data-dependent terms of eq. (8) on the tile pairs: float32 (batch, tiles, Bq or 1, heads, Rk).

    Args: see `windowed_scores`.
    """
    dtype = tokens.dtype
    scale = ops.cast(weights.scale, dtype)
    content = 0.0
    fold = folds_queries(weights, tokens.shape, neighbourhood, position_score)
    if weights.needs_queries:
        query_tokens = take_tokens(tokens, neighbourhood.query_index)  # (batch, tiles, Bq, C)
        if not fold:
            queries = project(query_tokens, weights.query_kernel, weights.query_bias)
            queries = queries * scale  # scaled once, as on the global path
    if weights.needs_keys:
        if keys_from_inputs(weights):
            content_content = weights.use_content_content
            content = content + _input_region_key_terms(
                query_tokens if content_content and fold else None,
                queries if content_content and not fold else None,
                region,
                weights,
                scale,
            )
        else:
            keys = project(tokens, weights.key_kernel, weights.key_bias)
            key_region = ops.take(keys, neighbourhood.region_index, axis=1)  # (batch, tiles, Rk, heads, key_dim)
            if weights.use_content_content:
                content = content + ops.cast(ops.einsum("bnihd,bnrhd->bnihr", queries, key_region), "float32")
            if weights.use_key_bias:
                key_bias = ops.einsum("bnrhd,hd->bnhr", key_region, ops.cast(weights.u, dtype))
                content = content + ops.cast(key_bias * scale, "float32")[:, :, None]
    if weights.use_content_position:
        if fold:
            content = content + position_score.windowed_axis_scores(
                lambda part, table: folded_per_shift_scores(query_tokens, part, table, weights), neighbourhood
            )
        else:
            queries_in_encoding = position_queries(queries, weights.position_key_kernel, position_score.encoding_dim)
            content = content + position_score.windowed_content_position_scores(queries_in_encoding, neighbourhood)
    return content


def _input_region_key_terms(folded_query_tokens, queries, region, weights, scale):
    """The key terms ``q . k`` and ``s u . k`` against the input region (keys from the inputs), float32.

    The queries of the content-content term are either ``folded_query_tokens``, the tiles' query
    tokens (batch, tiles, Bq, C) when the queries are folded into the kernel, or ``queries``, the
    scaled queries (batch, tiles, Bq, heads, key_dim); both are None without that term.
    """
    content = 0.0
    if weights.use_content_content:
        if folded_query_tokens is not None:
            # s Wq_h Wk_h^T as one (C, heads, C) kernel: no (batch, T, heads, key_dim) queries at all.
            kernel = ops.einsum("chd,ehd->che", weights.query_kernel, weights.key_kernel) * scale
            key_queries = ops.einsum("bnic,che->bnihe", folded_query_tokens, kernel)
            if weights.query_bias is not None:
                bias = ops.einsum("hd,ehd->he", weights.query_bias, weights.key_kernel)
                key_queries = key_queries + bias * scale
        else:
            key_queries = ops.einsum("bnihd,chd->bnihc", queries, weights.key_kernel)
        content = content + ops.cast(ops.einsum("bnihc,bnrc->bnihr", key_queries, region), "float32")
    if weights.use_key_bias:
        key_vectors = ops.einsum("chd,hd->ch", weights.key_kernel, ops.cast(weights.u, region.dtype))
        key_bias = ops.einsum("bnrc,ch->bnhr", region, key_vectors)
        content = content + ops.cast(key_bias * scale, "float32")[:, :, None]
    if weights.key_bias is not None:
        content = content + key_bias_constants(folded_query_tokens, queries, weights, region.dtype)
    return content


def folded_per_shift_scores(query_tokens, part, table, weights):
    """``q_h[part] . e`` for every row ``e`` (a shift) of `table`, with ``q = s (X Wq + b_q)`` folded into a kernel.

    Returns (batch, tiles, Bq, heads, shifts) in the tokens' dtype. ``part`` picks the query channels
    that meet the table (`LearnedRelativeScore.windowed_axis_scores`).
    """
    dtype = query_tokens.dtype
    scale = ops.cast(weights.scale, dtype)
    table = ops.cast(table, dtype)
    kernel = ops.einsum("chd,sd->chs", weights.query_kernel[..., part], table) * scale
    scores = ops.einsum("bnic,chs->bnihs", query_tokens, kernel)
    if weights.query_bias is not None:
        scores = scores + ops.einsum("hd,sd->hs", weights.query_bias[..., part], table) * scale
    return scores


def key_bias_constants(folded_query_tokens, queries, weights, dtype):
    """The key-projection bias's terms ``q . b_k`` and ``u . b_k``, float32 (batch, tiles, Bq, heads, 1) or less.

    They are the same for every key of a query, so the softmax ignores them; they are added
    (cheaply: no key axis) so that the bias gets its (zero) gradient, as on the global path,
    instead of none at all. The queries are ``folded_query_tokens`` (the tiles' query tokens)
    when folded into the kernels, else ``queries``; both None without the content-content term.
    """
    key_bias = weights.key_bias
    scale = ops.cast(weights.scale, dtype)
    total = 0.0
    if folded_query_tokens is not None:  # folded queries: q . b_k = s (X_q Wq + b_q) . b_k
        per_query = ops.einsum(
            "bnic,ch->bnih", folded_query_tokens, ops.einsum("chd,hd->ch", weights.query_kernel, key_bias)
        )
        if weights.query_bias is not None:
            per_query = per_query + ops.einsum("hd,hd->h", weights.query_bias, key_bias)
        total = total + ops.cast(per_query * scale, "float32")[..., None]
    elif queries is not None:
        total = total + ops.cast(ops.einsum("bnihd,hd->bnih", queries, key_bias), "float32")[..., None]
    if weights.use_key_bias:
        total = (
            total + ops.cast(ops.einsum("hd,hd->h", ops.cast(weights.u, dtype), key_bias) * scale, "float32")[:, None]
        )
    return total


def windowed_contraction(probabilities, region, neighbourhood, output_kernel):
    """``sum_h P_h X W_h`` for every query, in token order: (batch, T, output_dim) in the region's dtype.

    `probabilities` are the (dropped-out) tile probabilities of `windowed_scores`; the
    contraction over keys carries the input channels, then the merged value/output kernel
    maps each query's heads to the outputs before the queries leave the tile layout.
    """
    probabilities = ops.cast(probabilities, region.dtype)
    equation = "nihr,bnrc->bnihc" if ops.ndim(probabilities) == 4 else "bnihr,bnrc->bnihc"
    context = ops.einsum(equation, probabilities, region)
    outputs = ops.einsum("bnihc,hco->bnio", context, output_kernel)
    tiles, queries = neighbourhood.query_index.shape
    outputs = ops.reshape(outputs, (-1, tiles * queries, outputs.shape[-1]))
    return take_tokens(outputs, neighbourhood.untile_index)


def windowed_multiply_adds(neighbourhood, weights, num_heads, input_dim, output_dim, position_score=None):
    """Multiply-adds per example that `windowed_attention` runs on a grid: ``(linear, attention)``.

    Counted product by product as the functions above compute them: every query slot of the
    tiles (``tiles * Bq``, a short tile repeats its last query) against every key of its
    region (``Rk``, masked keys included), with the queries folded into the kernels where
    `folds_queries` folds them (for one example). ``linear``: products with weights or
    kernels made from weights only; ``attention``: the rest. Products that do not depend on
    the example (position-only scores, folded kernels) are shared by the batch and not counted.
    """
    heads, channels = num_heads, input_dim
    kernel = weights.query_kernel if weights.query_kernel is not None else weights.key_kernel
    key_dim = None if kernel is None else kernel.shape[-1]
    tiles, region = neighbourhood.region_index.shape
    query_slots = neighbourhood.query_index.size
    height, width = neighbourhood.height, neighbourhood.width
    fold = folds_queries(weights, (1, height * width, channels), neighbourhood, position_score)
    linear = query_slots * heads * channels * output_dim  # the merged value/output kernel
    attention = neighbourhood.tile_pairs * heads * channels  # probabilities x the input region
    if weights.needs_queries and not fold:
        linear += query_slots * channels * heads * key_dim
    if weights.needs_keys and keys_from_inputs(weights):
        if weights.use_content_content:
            linear += query_slots * heads * channels * (channels if fold else key_dim)  # q Wk^T
            attention += neighbourhood.tile_pairs * heads * channels
        if weights.use_key_bias:
            attention += tiles * region * channels * heads
        if weights.key_bias is not None and weights.use_content_content:
            attention += query_slots * heads * (channels if fold else key_dim)
    elif weights.needs_keys:
        linear += height * width * channels * heads * key_dim
        if weights.use_content_content:
            attention += neighbourhood.tile_pairs * heads * key_dim
        if weights.use_key_bias:
            attention += tiles * region * heads * key_dim
    if weights.use_content_position:
        if weights.position_key_kernel is not None:
            linear += query_slots * heads * key_dim * position_score.encoding_dim
        attention += heads * position_score.windowed_content_position_multiply_adds(
            neighbourhood, channels if fold else None
        )
    return linear, attention
