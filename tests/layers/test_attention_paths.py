"""The attention paths as functions of tensors, each against a plain NumPy computation.

`keras_attnconv.layers.attention_paths` (general, shared position-only, separable) and
`keras_attnconv.layers.windowed_attention` (windowed) are called directly on small tensors,
without a layer. The reference of every path is the general one written out in NumPy
(float64): per head ``P = softmax(q k^T + terms)`` and ``outputs = sum_h P_h X W_h``.
"""

import numpy as np
import pytest
from keras import ops
from support import np_softmax

from keras_attnconv.layers import attention_paths, windowed_attention
from keras_attnconv.layers.attention_paths import ScoreWeights
from keras_attnconv.layers.neighbourhood import get_neighbourhood

BATCH, HEIGHT, WIDTH, CHANNELS, HEADS = 2, 5, 6, 4, 3
TOKENS = HEIGHT * WIDTH


def tensors(*shapes, seed=0, scale=0.5):
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, scale, shape).astype("float32") for shape in shapes]


def numpy(x):
    return ops.convert_to_numpy(x).astype("float64")


def reference_attention(scores, values, output_kernel):
    """The general path in NumPy: ``P = softmax(scores)`` (batch, heads, T, T) and ``sum_h P_h X W_h``."""
    probabilities = np_softmax(np.asarray(scores, "float64"))
    outputs = np.einsum("bhqk,bkc,hco->bqo", probabilities, np.asarray(values, "float64"), output_kernel)
    return outputs, probabilities


def grid_shifts():
    """Row and column shift (key - query) of every pixel pair, (T, T) each."""
    rows, columns = np.divmod(np.arange(TOKENS), WIDTH)
    return rows[None, :] - rows[:, None], columns[None, :] - columns[:, None]


def test_general_attention_is_the_softmax_of_q_k_plus_the_score_terms_per_head():
    queries, keys, values, kernel, key_term, position = tensors(
        (BATCH, TOKENS, HEADS, 2),
        (BATCH, TOKENS, HEADS, 2),
        (BATCH, TOKENS, CHANNELS),
        (HEADS, CHANNELS, 5),
        (BATCH, HEADS, 1, TOKENS),
        (HEADS, TOKENS, TOKENS),
    )
    outputs, probabilities = attention_paths.general_attention(queries, keys, values, kernel, (key_term, position))
    scores = np.einsum("bqhd,bkhd->bhqk", queries, keys) + key_term + position
    expected, expected_probabilities = reference_attention(scores, values, kernel)
    np.testing.assert_allclose(numpy(probabilities), expected_probabilities, atol=1e-6)
    np.testing.assert_allclose(numpy(outputs), expected, atol=1e-5)


def test_an_attention_mask_gives_the_keys_it_hides_no_weight():
    queries, keys, values, kernel = tensors(
        (BATCH, TOKENS, HEADS, 2), (BATCH, TOKENS, HEADS, 2), (BATCH, TOKENS, CHANNELS), (HEADS, CHANNELS, 5), seed=1
    )
    mask = get_neighbourhood(HEIGHT, WIDTH, (3, 3)).window_mask()
    outputs, probabilities = attention_paths.general_attention(queries, keys, values, kernel, attention_mask=mask)
    scores = np.where(mask, np.einsum("bqhd,bkhd->bhqk", queries, keys), -np.inf)
    expected, expected_probabilities = reference_attention(scores, values, kernel)
    assert (numpy(probabilities)[..., ~mask] == 0).all()
    np.testing.assert_allclose(numpy(probabilities), expected_probabilities, atol=1e-6)
    np.testing.assert_allclose(numpy(outputs), expected, atol=1e-5)


def test_dropout_applies_to_the_probabilities_and_the_returned_ones_are_before_it():
    queries, keys, values, kernel = tensors(
        (BATCH, TOKENS, HEADS, 2), (BATCH, TOKENS, HEADS, 2), (BATCH, TOKENS, CHANNELS), (HEADS, CHANNELS, 5), seed=2
    )
    kept = np.random.default_rng(3).random((BATCH, HEADS, TOKENS, TOKENS)) < 0.7
    outputs, probabilities = attention_paths.general_attention(
        queries, keys, values, kernel, dropout=lambda p: ops.where(kept, p / 0.7, 0.0)
    )
    expected_probabilities = np_softmax(np.einsum("bqhd,bkhd->bhqk", queries, keys).astype("float64"))
    expected = np.einsum("bhqk,bkc,hco->bqo", np.where(kept, expected_probabilities / 0.7, 0.0), values, kernel)
    np.testing.assert_allclose(numpy(probabilities), expected_probabilities, atol=1e-6)
    np.testing.assert_allclose(numpy(outputs), expected, atol=1e-5)


@pytest.mark.parametrize("queries", [TOKENS, 2], ids=["queries_are_keys", "queries_no_more_than_outputs"])
@pytest.mark.parametrize("shared", [False, True], ids=["per_example", "shared_by_the_batch"])
@pytest.mark.parametrize("output_dim", [2, 7], ids=["values_first", "contexts_first"])
def test_both_contraction_orders_compute_the_sum_over_heads(output_dim, shared, queries):
    # Shared probabilities with values first (output_dim 2 < 4 channels) take one batched matmul where
    # queries <= output_dim (2 of 30 keys), else an einsum: each order and form against the same sum.
    probabilities, values, kernel = tensors(
        (HEADS, queries, TOKENS) if shared else (BATCH, HEADS, queries, TOKENS),
        (BATCH, TOKENS, CHANNELS),
        (HEADS, CHANNELS, output_dim),
        seed=4,
    )
    assert attention_paths.values_first(CHANNELS, output_dim, TOKENS) == (output_dim < CHANNELS)
    expected = np.einsum(f"{'' if shared else 'b'}hqk,bkc,hco->bqo", probabilities, values, kernel)
    np.testing.assert_allclose(
        numpy(attention_paths.contract_heads(probabilities, values, kernel)), expected, atol=1e-5
    )


def test_shared_position_attention_equals_the_per_example_computation():
    position, values, kernel = tensors(
        (HEADS, TOKENS, TOKENS), (BATCH, TOKENS, CHANNELS), (HEADS, CHANNELS, 5), seed=5, scale=2.0
    )
    outputs, probabilities = attention_paths.shared_position_attention(position, values, kernel)
    per_example = np.broadcast_to(position, (BATCH, *position.shape))
    expected, expected_probabilities = attention_paths.general_attention(None, None, values, kernel, (per_example,))
    assert tuple(probabilities.shape) == (HEADS, TOKENS, TOKENS)  # computed once, for the whole batch
    for example in range(BATCH):
        np.testing.assert_allclose(numpy(probabilities), numpy(expected_probabilities)[example], atol=1e-6)
    np.testing.assert_allclose(numpy(outputs), numpy(expected), atol=1e-5)


def test_position_softmax_is_the_softmax_of_rows_with_masked_and_far_away_keys():
    scores = tensors((HEADS, TOKENS, TOKENS), seed=6, scale=3.0)[0]
    scores[0] -= 1e4  # a head centered far away: every score far below zero
    scores[1, :, ::2] = -np.inf
    np.testing.assert_allclose(
        numpy(attention_paths.position_softmax(scores)), np_softmax(scores.astype("float64")), atol=1e-6
    )


@pytest.mark.parametrize("windowed", [False, True], ids=["global", "window"])
def test_separable_attention_equals_the_general_path_for_a_separable_position_score(windowed):
    row_scores, column_scores, inputs, kernel = tensors(
        (HEADS, HEIGHT, HEIGHT),
        (HEADS, WIDTH, WIDTH),
        (BATCH, HEIGHT, WIDTH, CHANNELS),
        (HEADS, CHANNELS, 5),
        seed=7,
        scale=1.5,
    )
    neighbourhood = get_neighbourhood(HEIGHT, WIDTH, (3, 5))
    if windowed:  # a window is a row window times a column window
        row_mask, column_mask = neighbourhood.axis_masks()
        row_scores = np.where(row_mask, row_scores, -np.inf)
        column_scores = np.where(column_mask, column_scores, -np.inf)
    outputs, (rows, columns) = attention_paths.separable_attention(row_scores, column_scores, inputs, kernel)
    scores = (row_scores[:, :, None, :, None] + column_scores[:, None, :, None, :]).reshape(HEADS, TOKENS, TOKENS)
    expected, expected_probabilities = reference_attention(
        np.broadcast_to(scores, (BATCH, *scores.shape)), inputs.reshape(BATCH, TOKENS, CHANNELS), kernel
    )
    np.testing.assert_allclose(numpy(outputs).reshape(expected.shape), expected, atol=1e-5)
    np.testing.assert_allclose(
        numpy(attention_paths.separable_probabilities(rows, columns)), expected_probabilities[0], atol=1e-6
    )
    if windowed:  # the window keys' probabilities, read without the (T, T) product
        keys = np.broadcast_to(neighbourhood.key_indices, (HEADS, *neighbourhood.key_indices.shape))
        np.testing.assert_allclose(
            numpy(attention_paths.separable_window_entries(rows, columns, neighbourhood.key_indices)),
            np.take_along_axis(expected_probabilities[0], keys, axis=-1),
            atol=1e-6,
        )


def content_weights(key_dim, seed):
    """`ScoreWeights` of the content-content and key-bias terms, with projection biases."""
    query_kernel, query_bias, key_kernel, key_bias, u = tensors(
        (CHANNELS, HEADS, key_dim),
        (HEADS, key_dim),
        (CHANNELS, HEADS, key_dim),
        (HEADS, key_dim),
        (HEADS, key_dim),
        seed=seed,
    )
    return ScoreWeights(
        use_content_content=True,
        use_key_bias=True,
        scale=key_dim**-0.5,
        query_kernel=query_kernel,
        query_bias=query_bias,
        key_kernel=key_kernel,
        key_bias=key_bias,
        u=u,
    )


def content_scores(tokens, weights):
    """``q . k + s u . k`` of every pixel pair in NumPy, (batch, heads, T, T)."""
    queries = weights.scale * (np.einsum("btc,chd->bthd", tokens, weights.query_kernel) + weights.query_bias)
    keys = np.einsum("btc,chd->bthd", tokens, weights.key_kernel) + weights.key_bias
    key_bias = weights.scale * np.einsum("hd,bkhd->bhk", weights.u, keys)
    return np.einsum("bqhd,bkhd->bhqk", queries, keys) + key_bias[:, :, None, :]


@pytest.mark.parametrize("key_dim", [3, 6], ids=["key_region", "input_region_folded"])
def test_windowed_attention_equals_the_general_path_masked_outside_the_windows(key_dim):
    """Tiles of queries against their key regions: eq. (8) with -inf outside NATTEN's windows."""
    neighbourhood = get_neighbourhood(HEIGHT, WIDTH, (3, 3), (1, 2))
    tokens, kernel, shift_scores = tensors(
        (BATCH, TOKENS, CHANNELS), (HEADS, CHANNELS, 5), (HEADS, 2 * HEIGHT - 1, 2 * WIDTH - 1), seed=8
    )
    weights = content_weights(key_dim, seed=9)
    # key_dim < C gathers a region of keys; key_dim >= C gathers the inputs and folds the queries.
    assert windowed_attention.keys_from_inputs(weights) == (key_dim >= CHANNELS)
    assert windowed_attention.folds_queries(weights, tokens.shape, neighbourhood) == (key_dim >= CHANNELS)
    position_terms = windowed_attention.window_position_terms(neighbourhood, shift_scores)
    outputs, tile_probabilities = windowed_attention.windowed_attention(
        tokens, neighbourhood, kernel, weights, position_terms
    )
    row_shift, column_shift = grid_shifts()
    position = shift_scores[:, row_shift + HEIGHT - 1, column_shift + WIDTH - 1]
    mask = neighbourhood.window_mask()
    scores = np.where(mask, content_scores(tokens, weights) + position, -np.inf)
    expected, expected_probabilities = reference_attention(scores, tokens, kernel)
    np.testing.assert_allclose(numpy(outputs), expected, atol=1e-5)
    keys = np.broadcast_to(neighbourhood.key_indices, (BATCH, HEADS, *neighbourhood.key_indices.shape))
    np.testing.assert_allclose(
        numpy(windowed_attention.window_probabilities(tile_probabilities, neighbourhood)),
        np.take_along_axis(expected_probabilities, keys, axis=-1),
        atol=1e-6,
    )


def test_window_position_terms_read_axis_scores_at_each_pairs_rows_and_columns():
    """Per-axis tables (the peaked separable scores) give each tile pair row[q_row, k_row] + column[q_col, k_col]."""
    neighbourhood = get_neighbourhood(HEIGHT, WIDTH, (3, 5), (1, 1))
    rows, columns = tensors((HEADS, HEIGHT, HEIGHT), (HEADS, WIDTH, WIDTH), seed=11)
    terms = numpy(windowed_attention.window_position_terms(neighbourhood, axis_scores=(rows, columns)))
    query_row, query_col = np.divmod(neighbourhood.query_index[:, :, None], WIDTH)
    key_row, key_col = np.divmod(neighbourhood.region_index[:, None, :], WIDTH)
    expected = rows[:, query_row, key_row] + columns[:, query_col, key_col]  # (heads, tiles, Bq, Rk)
    np.testing.assert_array_equal(terms, np.transpose(expected, (1, 2, 0, 3)))


def test_windowed_position_only_attention_is_computed_once_for_the_batch():
    neighbourhood = get_neighbourhood(HEIGHT, WIDTH, (3, 5))
    tokens, kernel, shift_scores = tensors(
        (BATCH, TOKENS, CHANNELS), (HEADS, CHANNELS, 5), (HEADS, 2 * HEIGHT - 1, 2 * WIDTH - 1), seed=10, scale=2.0
    )
    outputs, tile_probabilities = windowed_attention.windowed_attention(
        tokens,
        neighbourhood,
        kernel,
        position_terms=windowed_attention.window_position_terms(neighbourhood, shift_scores),
    )
    assert ops.ndim(tile_probabilities) == 4  # (tiles, Bq, heads, Rk): no batch axis
    row_shift, column_shift = grid_shifts()
    position = shift_scores[:, row_shift + HEIGHT - 1, column_shift + WIDTH - 1]
    expected, _ = reference_attention(
        np.broadcast_to(np.where(neighbourhood.window_mask(), position, -np.inf), (BATCH, *position.shape)),
        tokens,
        kernel,
    )
    np.testing.assert_allclose(numpy(outputs), expected, atol=1e-5)
