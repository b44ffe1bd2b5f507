"""Content attention with the key projection folded into the queries, laid out query-major.

Eq. (8)'s content-content term per head is ``s (x_q Wq + b_q) . (x_k Wk + b_k)``.
With ``u`` the key-bias vector (zero when that term is off) and ``beta = b_q + u``,
the content-content and key-bias terms together are

    s (x_q Wq + beta) Wk^T . x_k  +  s (x_q Wq + beta) . b_k

The first is a product of each query's *folded query* ``s (x_q Wq + beta) Wk^T``,
(heads, C), with the key's token itself; the second does not depend on the key.
So the keys are the tokens: no key projection, and the scores of a batch are
one matmul per example, (T * heads, C) x (C, T), laid out (batch, query, head,
key). Every other step keeps that layout: the contexts ``P_h X`` are one matmul
per example, (T * heads, T) x (T, C), (batch, query, head, C), and the output
``sum_h context_h W_h`` one matmul over (head, C). Nothing of the queries', the
keys' or the probabilities' size is re-laid out, which the (batch, head, query,
key) layout of `attention_paths.general_attention` needs at every matmul.

The second term, the query's alone, is dropped: softmax ignores it
(`folded_query_kernels` keeps ``b_k``'s gradient, exactly zero). The same
function as `general_attention` on `global_score_parts`, and cheaper wherever
``key_dim >= C`` (the paper's models: 400 and 400): the folded queries (heads
* C wide) replace the queries and the keys (2 * heads * key_dim), and the
scores contract C channels instead of key_dim.
`path_rule.folds_key_projection` says where it runs.
"""

import functools
import operator

from keras import ops

from keras_attnconv.layers.attention_paths import (
    attention_scores,
    contract_heads_query_major,
    encoding_query_kernel,
    project,
    shift_score_kernel,
)
from keras_attnconv.layers.shift_geometry import pair_scores_from_axis_shifts


def folded_query_kernels(weights, dtype):
    """``(kernel, bias)`` of the folded queries' map from the tokens, ``s (X Wq + beta) Wk^T``, from `ScoreWeights`.

    Returns:
        kernel ``s Wq Wk^T`` (C, heads, C) and bias ``s beta Wk^T`` (heads, C) or None, in `dtype`.

    ``b_k`` enters eq. (8) only through ``s (x_q Wq + beta) . b_k``, the same for every key, which
    softmax ignores: its gradient is exactly zero. It enters the kernel times zero so that every
    backend gives it that zero (TensorFlow would give None, and the optimizer would skip the
    variable and its weight decay), without a pass over the scores' gradient.
    """
    scale = ops.cast(weights.scale, dtype)
    query_kernel, key_kernel = ops.cast(weights.query_kernel, dtype), ops.cast(weights.key_kernel, dtype)
    biases = [weights.query_bias, weights.u if weights.use_key_bias else None]
    present = [ops.cast(bias, dtype) for bias in biases if bias is not None]
    beta = functools.reduce(operator.add, present) if present else None
    kernel = ops.einsum("chd,ehd->che", query_kernel, key_kernel) * scale
    if weights.key_bias is not None:
        kernel = kernel + ops.sum(ops.cast(weights.key_bias, dtype)) * 0
    bias = None if beta is None else ops.einsum("hd,ehd->he", beta, key_kernel) * scale
    return kernel, bias


def key_folded_attention(
    tokens,
    weights,
    height,
    width,
    output_kernel,
    position_score=None,
    position_bias=None,
    span_bias=None,
    attention_mask=None,
    dropout=None,
    fold_content_position=True,
):
    """Eq. (8) over all keys with the content-content term on: `general_attention` of `global_score_parts`.

    Args:
        tokens: (batch, T, C) in the compute dtype, the values and (here) the keys.
        weights: `ScoreWeights` with ``use_content_content``.
        height, width: the static grid of the tokens.
        output_kernel: (heads, C, output_dim), the merged value/output kernel.
        position_score: the `PositionScore` the content-position term reads (with that term only).
        position_bias, span_bias: float32 (heads, T, T) or None, as in `global_score_parts`.
        attention_mask: None or a bool (T, T) array: whether a query attends to a key.
        dropout: None, or a callable applied to the float32 probabilities, (batch, T, heads, T) here.
        fold_content_position: bool, the content-position term of a score with an
            `axis_shift_table` is read from each query's per-shift scores (as `global_score_parts`).

    Returns:
        ``(outputs, probabilities)``: (batch, T, output_dim) in the dtype of `tokens`, and the
        float32 (batch, heads, T, T) probabilities before dropout.
    """
    folded_queries = project(tokens, *folded_query_kernels(weights, tokens.dtype))
    terms = [ops.cast(ops.einsum("bqhc,bkc->bqhk", folded_queries, tokens), "float32")]
    if weights.use_content_position:
        terms.append(
            _content_position_query_major(tokens, weights, height, width, position_score, fold_content_position)
        )
    # The position-only terms (heads, T, T), laid out (T, heads, T) as the scores are.
    terms += [
        ops.transpose(ops.cast(term, "float32"), (1, 0, 2)) for term in (position_bias, span_bias) if term is not None
    ]
    mask = None if attention_mask is None else ops.convert_to_tensor(attention_mask)[:, None, :]
    probabilities = ops.softmax(attention_scores(None, None, tuple(terms), mask), axis=-1)
    dropped = probabilities if dropout is None else dropout(probabilities)
    outputs = contract_heads_query_major(ops.cast(dropped, tokens.dtype), tokens, output_kernel)
    return outputs, ops.transpose(probabilities, (0, 2, 1, 3))


def _content_position_query_major(tokens, weights, height, width, position_score, fold_content_position):
    """The content-position term ``q W_hat . r_delta``, float32 (batch, T, heads, T), from the tokens."""
    table = position_score.axis_shift_table(height, width) if fold_content_position else None
    if table is not None:
        per_shift = project(tokens, *shift_score_kernel(weights, ops.cast(table, tokens.dtype)))
        return pair_scores_from_axis_shifts(per_shift, height, width, query_major=True)
    queries_in_encoding = project(tokens, *encoding_query_kernel(weights, tokens.dtype, position_score.encoding_dim))
    return ops.transpose(position_score.content_position_scores(queries_in_encoding, height, width), (0, 2, 1, 3))
