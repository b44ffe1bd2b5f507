"""The global and separable paths of `RelativeMultiHeadAttention` as functions of tensors.

Every path computes, per head ``h``, attention probabilities ``P_h`` (a softmax
over keys of float32 scores) and the output

    outputs = sum_h dropout(P_h) X W_h

where ``X`` (batch, T, C) are the input tokens, which serve as the values
(the paper's ``D_h = D_in``), and ``W_h`` (C, output_dim) is head h's slice of
the merged value/output kernel ``(heads, C, output_dim)``. The paths differ in
how the scores are formed and how ``P`` is applied:

- `general_attention`: eq. (8) over all ``T`` keys, per example:
  ``softmax(q k^T + other terms)``, probabilities (batch, heads, T, T). A
  window is an attention mask.
- `shared_position_attention`: position-only heads, whose scores (heads, T, T)
  do not depend on the example: the probabilities are computed once and
  applied to every example of the batch.
- `separable_attention`: position-only heads whose scores are a row term plus
  a column term, ``P_h = R_h (x) C_h``, applied as a row pass and a column
  pass, ``O(T (H + W))`` instead of ``O(T^2)`` per channel and head.
- `keras_attnconv.layers.windowed_attention.windowed_attention`: eq. (8) on
  tiles of queries against the keys of their windows, never a (T, T) tensor.

`global_score_parts` forms the inputs of the first two from the tokens and the
weights (`ScoreWeights`). Nothing here reads a layer: weights, position scores,
masks and dropout are arguments. Scores and softmax are float32; projections
and contractions run in the dtype of the tokens (the compute dtype).
"""

import dataclasses

import numpy as np
from keras import ops

from keras_attnconv.layers.shift_geometry import pair_scores_from_axis_shifts


@dataclasses.dataclass(frozen=True)
class ScoreWeights:
    """The data-dependent terms of eq. (8): which are on, and the weights they are computed with.

    ``q = s (X Wq + b_q)``, ``k = X Wk + b_k``; the terms are ``q . k``
    (content-content), ``q W_hat . r_delta`` (content-position) and
    ``s u . k`` (key bias). A tensor is None where no term on needs it.

    Attributes:
        use_content_content, use_content_position, use_key_bias: bool, the terms that are on.
        scale: float, ``s``.
        query_kernel, key_kernel: (C, heads, key_dim).
        query_bias, key_bias: (heads, key_dim), or None (no projection biases).
        u: (heads, key_dim), the key-bias vectors.
        position_key_kernel: (heads, key_dim, encoding_dim), a learned ``W_hat``; None means
            the identity padded to key_dim (the first encoding_dim query features meet ``r_delta``).
    """

    use_content_content: bool = False
    use_content_position: bool = False
    use_key_bias: bool = False
    scale: float = 1.0
    query_kernel: object = None
    query_bias: object = None
    key_kernel: object = None
    key_bias: object = None
    u: object = None
    position_key_kernel: object = None

    @property
    def uses_content(self):
        """Whether the scores depend on the input (else they are shared by the batch)."""
        return self.use_content_content or self.use_content_position or self.use_key_bias

    @property
    def needs_queries(self):
        return self.use_content_content or self.use_content_position

    @property
    def needs_keys(self):
        return self.use_content_content or self.use_key_bias


def project(tokens, kernel, bias=None):
    """Per-head projection ``X W + b``: tokens (batch, T, C), kernel (C, heads, d) -> (batch, T, heads, d).

    Tokens in the tile layout of the windowed path, (batch, tiles, Bq, C), give (batch, tiles, Bq, heads, d).
    """
    equation = "btc,chd->bthd" if ops.ndim(tokens) == 3 else "bnic,chd->bnihd"
    projected = ops.einsum(equation, tokens, kernel)
    return projected if bias is None else projected + bias


def position_queries(queries, position_key_kernel, encoding_dim):
    """The queries mapped into the encoding space, ``q W_hat``: (..., heads, key_dim) -> (..., heads, encoding_dim).

    Queries are (batch, T, heads, key_dim), or (batch, tiles, Bq, heads, key_dim) on the windowed path.
    """
    if position_key_kernel is None:
        return queries[..., :encoding_dim]
    equation = "bthd,hde->bthe" if ops.ndim(queries) == 4 else "bnihd,hde->bnihe"
    return ops.einsum(equation, queries, position_key_kernel)


def encoding_query_kernel(weights, dtype, encoding_dim):
    """``(kernel, bias)`` of the map from the tokens to the queries in the encoding space, ``s (X Wq + b_q) W_hat``.

    Args:
        weights: `ScoreWeights` with the content-position term on.
        dtype: the dtype of the result.
        encoding_dim: the width of the encoding (`PositionScore.encoding_dim`).

    Returns:
        kernel (C, heads, encoding_dim) and bias (heads, encoding_dim) or None.
    """
    scale = ops.cast(weights.scale, dtype)
    kernel = ops.cast(weights.query_kernel, dtype)
    bias = None if weights.query_bias is None else ops.cast(weights.query_bias, dtype)
    if weights.position_key_kernel is None:  # the identity, padded: the first encoding_dim query features
        kernel, bias = kernel[..., :encoding_dim], None if bias is None else bias[..., :encoding_dim]
    else:
        position_key_kernel = ops.cast(weights.position_key_kernel, dtype)
        kernel = ops.einsum("chd,hde->che", kernel, position_key_kernel)
        bias = None if bias is None else ops.einsum("hd,hde->he", bias, position_key_kernel)
    return kernel * scale, None if bias is None else bias * scale


def shift_score_kernel(weights, table):
    """The query projection folded with a score's `axis_shift_table`: ``(kernel, bias)`` of the map
    from the tokens to each query's scores per row and column shift, ``s (X Wq + b_q) W_hat table``.

    Args:
        weights: `ScoreWeights` with the content-position term on.
        table: (encoding_dim, shifts), in the compute dtype.

    Returns:
        kernel (C, heads, shifts) and bias (heads, shifts) or None, in the table's dtype.

    The projection then reads the tokens (C channels) instead of the queries (heads * key_dim, 9x
    as wide in the paper's models), and neither the queries nor their gradient is re-laid out
    per image row or column for this term: for `learned_content` at batch 100 in
    mixed_bfloat16, XLA's step for an H200 moves 11% fewer bytes (`attnconv bench --suite plan`).
    """
    kernel, bias = encoding_query_kernel(weights, table.dtype, table.shape[0])
    folded = ops.einsum("che,es->chs", kernel, table)
    return folded, None if bias is None else ops.matmul(bias, table)


def global_score_parts(
    tokens,
    weights,
    height,
    width,
    position_score=None,
    position_bias=None,
    span_bias=None,
    fold_content_position=False,
):
    """The inputs of `general_attention` or `shared_position_attention` for eq. (8) over all ``T = H*W`` keys.

    Args:
        tokens: (batch, T, C) in the compute dtype.
        weights: `ScoreWeights`.
        height, width: the static grid of the tokens.
        position_score: the `PositionScore` whose encoding the content-position term reads (only
            needed with that term).
        position_bias: float32 (heads, T, T), the position-bias term ``v_h . r_delta``, or None.
        span_bias: float32 (heads, T, T), an attention span's ``log g`` (-inf where it masks), or None.
        fold_content_position: bool, compute the content-position term of a score with an
            `axis_shift_table` from the tokens through `shift_score_kernel` (the same term; where
            `path_rule.folds_content_position`), else from the queries (`content_position_scores`).

    Returns:
        ``(queries, keys, score_terms)``: the scaled queries and the keys of the content-content
        term, (batch, T, heads, key_dim) in the compute dtype (None when the term is off), and
        the other terms of the scores (see `attention_scores`), float32, in this order: the
        key-bias term (batch, heads, 1 or T, T), the content-position term (batch, heads, T, T),
        the position bias ((1, heads, T, T) after a term of the example, else (heads, T, T)) and
        the span's ``log g`` (heads, T, T); only those that are on.
    """
    queries = keys = None
    terms = []  # added to q . k in the order of eq. (8): float sums depend on it (outputs as before)
    if weights.needs_queries:
        # Scale the queries once instead of every (T x T) score matrix.
        queries = project(tokens, weights.query_kernel, weights.query_bias) * ops.cast(weights.scale, tokens.dtype)
    if weights.needs_keys:
        keys = project(tokens, weights.key_kernel, weights.key_bias)
    if weights.use_key_bias:
        key_bias = ops.einsum("bkhd,hd->bhk", keys, ops.cast(weights.u, keys.dtype))
        key_bias = ops.cast(key_bias * ops.cast(weights.scale, keys.dtype), "float32")[:, :, None, :]
        if not (weights.needs_queries or position_bias is not None):
            # The key bias alone scores keys, not (query, key) pairs: give every query its row.
            tokens_count = height * width
            key_bias = ops.broadcast_to(key_bias, (ops.shape(tokens)[0], key_bias.shape[1], tokens_count, tokens_count))
        terms.append(key_bias)
    if weights.use_content_position:
        table = position_score.axis_shift_table(height, width) if fold_content_position else None
        if table is None:
            queries_in_encoding = position_queries(queries, weights.position_key_kernel, position_score.encoding_dim)
            terms.append(position_score.content_position_scores(queries_in_encoding, height, width))
        else:
            per_shift = project(tokens, *shift_score_kernel(weights, ops.cast(table, tokens.dtype)))
            terms.append(pair_scores_from_axis_shifts(per_shift, height, width))
    if position_bias is not None:
        position_bias = ops.cast(position_bias, "float32")
        terms.append(position_bias[None] if weights.uses_content else position_bias)
    if span_bias is not None:
        terms.append(span_bias)
    if not weights.use_content_content:
        queries = keys = None
    return queries, keys, tuple(terms)


def attention_scores(queries, keys, score_terms=(), attention_mask=None):
    """Scores ``q . k + term_1 + term_2 + ...``, float32 (batch, heads, T, T), or (heads, T, T) without q and k.

    Args:
        queries, keys: (batch, T, heads, key_dim), or both None.
        score_terms: float32 tensors broadcastable to (batch, heads, T, T), added in their order
            (a -inf masks a key). Without queries and keys, they are the scores.
        attention_mask: None, or bool broadcastable to the scores, e.g. (T, T): whether a query
            attends to a key; the scores of the others are -inf.
    """
    if (queries is None) != (keys is None):
        raise ValueError(
            "`queries` and `keys` go together: give both or neither. "
            f"Received: queries={'None' if queries is None else 'a tensor'}, "
            f"keys={'None' if keys is None else 'a tensor'}"
        )
    scores = None if queries is None else ops.cast(ops.einsum("bqhd,bkhd->bhqk", queries, keys), "float32")
    for term in score_terms:
        scores = term if scores is None else scores + term
    if scores is None:
        raise ValueError("Without queries and keys, the score terms are the scores. Received: score_terms=()")
    scores = ops.cast(scores, "float32")
    return scores if attention_mask is None else ops.where(attention_mask, scores, -np.inf)


def general_attention(queries, keys, values, output_kernel, score_terms=(), attention_mask=None, dropout=None):
    """Eq. (8) over all keys, per example: ``sum_h dropout(softmax(q_h k_h^T + terms_h)) X W_h``.

    Args:
        queries, keys: (batch, T, heads, key_dim), the scaled queries and the keys of the
            content-content term, or both None (other terms only).
        values: (batch, T, C), the tokens, in the compute dtype.
        output_kernel: (heads, C, output_dim), the merged value/output kernel.
        score_terms: the other terms of the scores, float32 tensors broadcastable to
            (batch, heads, T, T) and added in their order (`attention_scores`); -inf masks a key.
        attention_mask: None, or bool broadcastable to (batch, heads, T, T): whether a query
            attends to a key (e.g. a window, (T, T)).
        dropout: None, or a callable applied to the float32 probabilities (e.g. a Keras
            `Dropout` layer with its ``training`` argument bound).

    Returns:
        ``(outputs, probabilities)``: (batch, T, output_dim) in the dtype of `values`, and the
        float32 (batch, heads, T, T) probabilities before dropout.
    """
    probabilities = ops.softmax(attention_scores(queries, keys, score_terms, attention_mask), axis=-1)
    dropped = probabilities if dropout is None else dropout(probabilities)
    return contract_heads(ops.cast(dropped, values.dtype), values, output_kernel), probabilities


def shared_position_attention(position_scores, values, output_kernel, dropout=None):
    """Position-only heads: probabilities computed once from the positions, applied to every example.

    Args:
        position_scores: float32 (heads, T, T), the same for every example (-inf: masked).
        values: (batch, T, C), the tokens, in the compute dtype.
        output_kernel: (heads, C, output_dim).
        dropout: None, or a callable applied to the (heads, T, T) probabilities: it drops the
            same links for every example of the batch.

    Returns:
        ``(outputs, probabilities)``: (batch, T, output_dim) in the dtype of `values`, and the
        float32 (heads, T, T) probabilities before dropout.
    """
    probabilities = position_softmax(position_scores)
    dropped = probabilities if dropout is None else dropout(probabilities)
    return contract_heads(ops.cast(dropped, values.dtype), values, output_kernel), probabilities


def position_softmax(scores):
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


def values_first(input_dim, output_dim, keys_per_query):
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
    if input_dim != output_dim:
        return input_dim > output_dim
    return input_dim > keys_per_query


def contract_heads(probabilities, values, output_kernel):
    """``sum_h P_h X W_h``, contracting in the cheaper order for these shapes (`values_first`).

    Args:
        probabilities: (batch, heads, T, keys), or (heads, T, keys) shared by the batch, in the
            dtype of `values`.
        values: (batch, keys, C).
        output_kernel: (heads, C, output_dim).

    Returns:
        (batch, T, output_dim).
    """
    shared = ops.ndim(probabilities) == 3
    p = "hqk" if shared else "bhqk"
    if not values_first(values.shape[-1], output_kernel.shape[-1], probabilities.shape[-1]):
        context = ops.einsum(f"{p},bkc->bqhc", probabilities, values)
        return ops.einsum("bqhc,hco->bqo", context, output_kernel)
    projected = ops.einsum("bkc,hco->bkho", values, output_kernel)
    heads, queries, keys = probabilities.shape[-3:]
    output_dim = output_kernel.shape[-1]
    if not shared or queries > output_dim:
        return ops.einsum(f"{p},bkho->bqo", probabilities, projected)
    # Shared probabilities: one batched matmul over (key, head) together, the two axes `projected` holds side
    # by side. Written as an einsum over (k, h), XLA transposed `projected`, (batch, T, heads, output_dim);
    # the probabilities broadcast over the batch instead, (batch, queries, keys * heads), are no larger while
    # queries <= output_dim (the models': 256 <= 400). On an H200 the quadratic step's kernels
    # (`attnconv bench --suite profile`, batch 100, bfloat16) took 8.00 ms against 9.70 with the einsum, whose
    # transposes were 2.44 ms of those 9.70.
    rows = ops.reshape(ops.transpose(probabilities, (1, 2, 0)), (queries, keys * heads))
    batch = ops.shape(values)[0]
    return ops.matmul(
        ops.broadcast_to(rows, (batch, queries, keys * heads)),
        ops.reshape(projected, (batch, keys * heads, output_dim)),
    )


def contract_heads_query_major(probabilities, values, output_kernel):
    """``sum_h P_h X W_h`` for probabilities laid out (batch, queries, heads, keys): (batch, queries, output_dim).

    The contexts ``P_h X`` are one matmul per example, (queries * heads, keys) x (keys, C), laid
    out (batch, queries, heads, C), and the output one matmul over (heads, C) together: neither
    re-lays out anything (`key_folded_attention`).
    """
    contexts = ops.einsum("bqhk,bkc->bqhc", probabilities, values)
    return ops.einsum("bqhc,hco->bqo", contexts, output_kernel)


def separable_attention(row_scores, column_scores, inputs, output_kernel, dropout=None):
    """Position-only separable heads: ``P_h = R_h (x) C_h``, applied as a row pass then a column pass.

    With scores ``row_scores[h, i, k] + column_scores[h, j, l]`` for query pixel (i, j) and key
    pixel (k, l), the softmax over the grid is the outer product of a row softmax and a column
    softmax, so this equals `shared_position_attention` on those scores.

    Args:
        row_scores: float32 (heads, H, H), indexed by (query row, key row); -inf: masked.
        column_scores: float32 (heads, W, W), indexed by (query column, key column).
        inputs: (batch, H, W, C), the values, in the compute dtype.
        output_kernel: (heads, C, output_dim).
        dropout: None, or a callable applied to the row and to the column probabilities apart
            (a (query, key) link is kept when both its row and its column links are: use the
            rate ``1 - sqrt(1 - rate)`` for a link rate of ``rate``).

    Returns:
        ``(outputs, (rows, columns))``: (batch, H, W, output_dim) in the dtype of `inputs`, and
        the float32 row (heads, H, H) and column (heads, W, W) probabilities before dropout
        (`separable_probabilities` combines them).
    """
    rows = position_softmax(row_scores)
    columns = position_softmax(column_scores)
    dtype = inputs.dtype
    r = ops.cast(rows if dropout is None else dropout(rows), dtype)
    c = ops.cast(columns if dropout is None else dropout(columns), dtype)
    height, width = inputs.shape[1], inputs.shape[2]
    first = values_first(inputs.shape[-1], output_kernel.shape[-1], height + width)
    # One head at a time: the intermediates are (batch, H, W, channels), not (batch, H, W, heads,
    # channels), so they stay in cache and need no transposes; same FLOPs as all-heads einsums.
    # The heads are unstacked, not indexed: the gradient of an unstack is one stack of the heads'
    # gradients, where indexing gave each head's a pad to (heads, C, output_dim), all summed (9
    # passes over the kernel per layer; with TensorFlow's XLA on a 2-core CPU, the float32
    # quadratic step took 10-15% longer). A Keras variable is converted to a tensor first: JAX
    # refuses to unstack the variable itself.
    kernels = ops.unstack(ops.convert_to_tensor(output_kernel), axis=0)
    outputs = None
    for row, column, kernel in zip(ops.unstack(r, axis=0), ops.unstack(c, axis=0), kernels):
        if first:
            head_outputs = row_column_pass(row, column, ops.matmul(inputs, kernel))
        else:
            head_outputs = ops.matmul(row_column_pass(row, column, inputs), kernel)
        outputs = head_outputs if outputs is None else outputs + head_outputs
    return outputs, (rows, columns)


def row_column_pass(rows, columns, x):
    """``y[b, i, j] = sum_{k, l} rows[i, k] columns[j, l] x[b, k, l]`` for x of shape (batch, H, W, C).

    Two batched matmuls on reshapes of x, with the small factor broadcast over
    the batch: no transposes of x, unlike the equivalent einsums (which XLA
    lowers with a transpose per pass; `attnconv bench`'s layer table measures
    the difference).
    """
    batch = ops.shape(x)[0]
    height, width, channels = x.shape[1:]
    x = ops.matmul(ops.broadcast_to(rows, (batch, height, height)), ops.reshape(x, (batch, height, width * channels)))
    x = ops.matmul(
        ops.broadcast_to(columns, (batch * height, width, width)), ops.reshape(x, (batch * height, width, channels))
    )
    return ops.reshape(x, (batch, height, width, channels))


def separable_probabilities(rows, columns):
    """Row (heads, H, H) and column (heads, W, W) probabilities -> their product over pixels, (heads, T, T)."""
    heads, height, width = rows.shape[0], rows.shape[1], columns.shape[1]
    tokens = height * width
    return ops.reshape(rows[:, :, None, :, None] * columns[:, None, :, None, :], (heads, tokens, tokens))


def separable_window_entries(rows, columns, key_indices):
    """The window keys' entries of `separable_probabilities`, (heads, T, K), without forming it.

    Each window key's probability is its row factor times its column factor; ``key_indices``
    is the (T, K) int array of `Neighbourhood.key_indices`.
    """
    heads, height, width = rows.shape[0], rows.shape[1], columns.shape[1]
    query_rows, query_columns = np.divmod(np.arange(height * width)[:, None], width)
    key_rows, key_columns = np.divmod(key_indices, width)
    return ops.take(ops.reshape(rows, (heads, -1)), query_rows * height + key_rows, axis=1) * ops.take(
        ops.reshape(columns, (heads, -1)), query_columns * width + key_columns, axis=1
    )


def window_entries(probabilities, key_indices):
    """The window keys' entries of (..., heads, T, T) probabilities: (..., heads, T, K).

    ``key_indices`` is the (T, K) int array of `Neighbourhood.key_indices`.
    """
    heads, tokens = probabilities.shape[-3], probabilities.shape[-1]
    flat = ops.reshape(probabilities, ((-1, heads) if ops.ndim(probabilities) == 4 else (heads,)) + (tokens**2,))
    index = np.arange(tokens)[:, None] * tokens + key_indices
    return ops.take(flat, index.astype("int32"), axis=-1)


def per_example(probabilities, batch):
    """Attention probabilities as (batch, heads, ...); position-only ones (heads, ...) are shared by the batch."""
    if ops.ndim(probabilities) == 4:
        return probabilities
    return ops.broadcast_to(probabilities[None], (batch, *probabilities.shape))
