"""Specifications of content attention with the key projection folded into the queries (`key_folded_attention`).

Accelerators take it (`path_rule.folds_key_projection`); the tests force it on the CPU. It must be eq. (8),
with the values and gradients of the unfolded path, under every term, window, bias and dropout.
"""

import itertools

import keras
import numpy as np
import pytest
from keras import ops
from support import (
    assert_path_keeps_values_and_gradients,
    eq8_reference,
    randomize_weights,
    training_calls,
    value_and_gradients,
)

from keras_attnconv.layers import LearnedRelativeScore, RelativeMultiHeadAttention, SirenScore, relative_attention
from keras_attnconv.layers.path_rule import folds_key_projection
from keras_attnconv.layers.shift_geometry import pair_scores_from_axis_shifts

# The terms besides content-content (which the fold needs), every combination.
OTHER_TERMS = ("use_content_position", "use_key_bias", "use_position_bias")
TERM_SETS = [
    dict(zip(OTHER_TERMS, flags), use_content_content=True) for flags in itertools.product([False, True], repeat=3)
]
SCORES = {  # as test_relative_attention's: encodings that fit key_dim=4, with the per-head vectors or without
    "quadratic": lambda head_vectors: "quadratic",
    "learned": lambda head_vectors: LearnedRelativeScore(3, embedding_dim=4, max_position=5, head_vectors=head_vectors),
    "siren": lambda head_vectors: SirenScore(3, hidden_units=4, omega_0=3.0, head_vectors=head_vectors),
}


def force_paths(monkeypatch, fold_keys, fold_content_position=False):
    """Make layers built and called after this take (or not) the two folds, whatever this machine is."""
    monkeypatch.setattr(relative_attention, "folds_key_projection", lambda key_dim, input_dim: fold_keys)
    monkeypatch.setattr(relative_attention, "folds_content_position", lambda: fold_content_position)


# The content-position term per query and per shift (`folds_content_position`), where that term is on.
EQ8_CASES = [
    (terms, per_shift)
    for terms in TERM_SETS
    for per_shift in ([False, True] if terms["use_content_position"] else [False])
]


@pytest.mark.parametrize(
    "terms, fold_content_position",
    EQ8_CASES,
    ids=[
        "+".join(k[4:] for k, v in t.items() if v) + ("-per_shift" if per_shift else "") for t, per_shift in EQ8_CASES
    ],
)
@pytest.mark.parametrize("score", sorted(SCORES))
def test_the_key_folded_path_equals_numpy_eq8(monkeypatch, terms, score, fold_content_position):
    # key_dim 4 < 6 channels: the rule would not fold these shapes; forced, the fold is still eq. (8).
    force_paths(monkeypatch, True, fold_content_position)
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 6)).astype("float32")
    layer = RelativeMultiHeadAttention(
        num_heads=3, output_dim=5, key_dim=4, position_score=SCORES[score](terms["use_position_bias"]), **terms
    )
    layer.build(x.shape)
    randomize_weights(layer, scale=0.5)
    outputs, probabilities = layer(x, return_attention_scores=True)
    expected, expected_probabilities = eq8_reference(layer, x)
    np.testing.assert_allclose(ops.convert_to_numpy(probabilities), expected_probabilities, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(outputs), expected, atol=1e-5)


@pytest.mark.parametrize(
    "use_bias, projection, window",
    [(True, False, None), (True, True, 3), (False, True, None), (False, False, 3)],
    ids=["biases", "biases-w_hat-window", "w_hat", "window"],
)
def test_the_key_folded_path_has_the_unfolded_path_s_values_and_gradients(monkeypatch, use_bias, projection, window):
    # Every term and the biases: the key bias b_k, which softmax ignores, keeps its gradient (zero), and the
    # key-bias term's u folds into the queries' bias. A window is a mask on this global path.
    x = np.random.default_rng(3).normal(size=(2, 4, 5, 6)).astype("float32")

    def layer():
        return RelativeMultiHeadAttention(
            num_heads=3,
            position_score=LearnedRelativeScore(3, embedding_dim=4, max_position=6),
            key_dim=6,
            use_content_content=True,
            use_content_position=True,
            use_key_bias=True,
            use_position_bias=True,
            position_key_projection=projection,
            use_bias=use_bias,
            window=window,
            windowed=False,
        )

    folded = assert_path_keeps_values_and_gradients(
        layer, lambda on: force_paths(monkeypatch, on, fold_content_position=True), x, seed=11
    )
    if use_bias:  # softmax ignores b_k: its gradient is exactly zero, and a tensor (TensorFlow would give None)
        gradients = value_and_gradients(folded, x)[1]
        names = ["inputs", *(v.name for v in folded.trainable_variables)]
        key_bias_gradient = gradients[names.index("key_bias")]
        assert key_bias_gradient is not None and not np.any(ops.convert_to_numpy(key_bias_gradient))


def test_the_key_folded_path_drops_links_at_the_rate(monkeypatch):
    # One head whose values are one-hot tokens and whose output kernel is the identity: the output is the
    # dropped probabilities, laid out (query, key), each link kept with probability 1 - rate and rescaled.
    force_paths(monkeypatch, True)
    rate, draws, height, width = 0.5, 200, 3, 4
    tokens = height * width
    x = np.eye(tokens, dtype="float32").reshape(1, height, width, tokens)
    layer = RelativeMultiHeadAttention(1, output_dim=tokens, dropout=rate, use_bias=False, use_content_content=True)
    layer.build(x.shape)
    randomize_weights(layer, seed=2)
    layer.output_kernel.assign(np.eye(tokens, dtype="float32")[None])
    probabilities = ops.convert_to_numpy(layer(x, return_attention_scores=True)[1])[0, 0]
    samples = training_calls(layer, x, draws).reshape(draws, tokens, tokens)
    kept = samples != 0
    np.testing.assert_array_less(np.abs(kept.mean(0) - (1 - rate)), 4.5 * np.sqrt(rate * (1 - rate) / draws))
    np.testing.assert_allclose(
        samples[kept], np.broadcast_to(probabilities / (1 - rate), samples.shape)[kept], rtol=1e-5
    )


def test_a_subclass_overriding_compute_attention_is_called_where_the_keys_would_fold(monkeypatch):
    # `_compute_attention` receives queries and keys: a layer whose class overrides it never takes the fold.
    force_paths(monkeypatch, True)
    calls = []

    class Recording(RelativeMultiHeadAttention):
        def _compute_attention(self, queries, keys, values, score_terms, attention_mask=None, training=None):
            calls.append((tuple(queries.shape), tuple(keys.shape)))
            return super()._compute_attention(queries, keys, values, score_terms, attention_mask, training)

    x = np.random.default_rng(4).normal(size=(2, 3, 3, 4)).astype("float32")
    Recording(2, key_dim=5, use_content_content=True)(x)
    assert calls == [((2, 9, 2, 5), (2, 9, 2, 5))]


def test_accelerators_fold_the_keys_where_the_queries_are_at_least_as_wide_as_the_tokens():
    assert folds_key_projection(400, 400, "gpu") and folds_key_projection(64, 32, "tpu")
    assert not folds_key_projection(32, 64, "gpu")  # folded queries (heads * 64) wider than queries and keys
    assert not folds_key_projection(400, 400, "cpu")  # the CPU keeps the path it was measured on
    with pytest.raises(ValueError, match="`platform`.*'npu'"):
        folds_key_projection(400, 400, "npu")


@pytest.mark.parametrize("grid", [(3, 4), (1, 5)], ids=lambda g: f"{g[0]}x{g[1]}")
def test_query_major_pair_scores_are_the_pair_scores_laid_out_query_head_key(grid):
    height, width = grid
    per_shift = np.random.default_rng(5).normal(size=(2, height * width, 3, 2 * height - 1 + 2 * width - 1))
    per_shift = per_shift.astype("float32")
    expected = ops.convert_to_numpy(pair_scores_from_axis_shifts(per_shift, height, width))
    query_major = ops.convert_to_numpy(pair_scores_from_axis_shifts(per_shift, height, width, query_major=True))
    np.testing.assert_array_equal(query_major, expected.transpose(0, 2, 1, 3))


def test_the_key_folded_path_under_mixed_precision_is_the_float32_path_within_its_precision(monkeypatch, mixed_policy):
    # Projections and contractions in the compute dtype, scores and softmax in float32, as on the unfolded path;
    # compiled by XLA (the accelerators' compiler) as a training step compiles it.
    force_paths(monkeypatch, True, fold_content_position=True)
    x = np.random.default_rng(6).normal(size=(2, 4, 4, 8)).astype("float32")
    arguments = dict(
        num_heads=2, position_score="learned", use_content_content=True, use_content_position=True, key_dim=8
    )
    layer = RelativeMultiHeadAttention(**arguments)
    layer.build(x.shape)
    randomize_weights(layer, seed=8, scale=0.3)
    reference = RelativeMultiHeadAttention(**arguments, dtype="float32")
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    model = keras.Sequential([keras.Input(x.shape[1:]), layer])
    model.compile(jit_compile=True)
    outputs = model.predict(x, verbose=0)
    compute_dtype = mixed_policy.split("_")[1]
    assert layer.compute_dtype == compute_dtype and outputs.dtype == compute_dtype
    expected = ops.convert_to_numpy(reference(x))
    np.testing.assert_allclose(outputs.astype("float32"), expected, atol=0.05 * np.abs(expected).max())
