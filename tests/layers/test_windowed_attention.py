"""Specifications of windowed (neighbourhood) attention: `RelativeMultiHeadAttention(window=K, dilation=d)`.

- The neighbourhood tables follow NATTEN's rule, checked against NATTEN's own boundary formula
  (``get_window_start`` of its CPU kernels, written out below independently of the package).
- The tiled windowed path equals global attention with an additive -inf mask outside the windows
  (``windowed=False``), in values and gradients, for every score, term combination and geometry;
  and that masked global attention equals eq. (8) in NumPy restricted to the NATTEN windows.
- The return format of the scores, the path choice, dropout on the windowed path, bad arguments.

Config and `.keras` round trips, XLA and dtype policies: test_keras_conformance.py (windowed cases).
"""

import itertools

import keras
import numpy as np
import pytest
from keras import ops
from support import (
    assert_same_values_and_gradients,
    dtype_of,
    eq8_reference,
    largest_backward_residual,
    randomize_weights,
    training_calls,
    value_and_gradients,
)

from keras_attnconv.layers import (
    DiagonalGaussianScore,
    RelativeMultiHeadAttention,
    SirenScore,
    TransformerEncoderBlock,
    windowed_attention,
)
from keras_attnconv.layers.neighbourhood import Neighbourhood, get_neighbourhood
from keras_attnconv.layers.shift_geometry import take_per_pair

HEADS, CHANNELS = 2, 5


def natten_window_start(index, length, kernel_size, dilation):
    """NATTEN's ``get_window_start`` (csrc/cpu/natten_cpu_commons.h), transcribed literally."""
    half_window = kernel_size // 2
    if dilation <= 1:
        return max(index - half_window, 0) + (index + half_window >= length) * (length - index - half_window - 1)
    ni = index - half_window * dilation
    if ni < 0:
        return index % dilation
    if index + half_window * dilation >= length:
        imodd = index % dilation
        a = (length // dilation) * dilation
        b = length - a
        if imodd < b:
            return length - b + imodd - 2 * half_window * dilation
        return a + imodd - kernel_size * dilation
    return ni


def natten_keys(height, width, window, dilation):
    """Flat key positions of every query's window, (T, Kh*Kw), row-major in the window, from NATTEN's rule."""
    (kh, kw), (dh, dw) = window, dilation
    keys = []
    for i, j in itertools.product(range(height), range(width)):
        row = natten_window_start(i, height, kh, dh)
        col = natten_window_start(j, width, kw, dw)
        keys.append([(row + m * dh) * width + col + n * dw for m in range(kh) for n in range(kw)])
    return np.array(keys)


@pytest.mark.parametrize(
    "length, window, dilation",
    [
        (length, window, dilation)
        for length in range(1, 23)
        for window in (1, 3, 5, 7)
        for dilation in (1, 2, 3)
        if window * dilation <= length
    ],
)
def test_axis_windows_follow_natten(length, window, dilation):
    keys = get_neighbourhood(1, length, (1, window), (1, dilation)).key_indices
    np.testing.assert_array_equal(keys, natten_keys(1, length, (1, window), (1, dilation)))


@pytest.mark.parametrize(
    "height, width, window, dilation",
    [
        (5, 7, (3, 3), (1, 1)),
        (6, 9, (5, 3), (1, 2)),
        (7, 8, (7, 7), (1, 1)),
        (9, 7, (3, 3), (3, 2)),
        (16, 16, (7, 5), (2, 3)),
        (64, 64, (7, 7), (1, 1)),
    ],
)
def test_2d_windows_and_tiles_follow_natten(height, width, window, dilation):
    """The product of the axis windows, and each tile holds exactly its queries' windows."""
    nb = Neighbourhood(height, width, window, dilation)
    expected = natten_keys(height, width, window, dilation)
    np.testing.assert_array_equal(nb.key_indices, expected)
    tokens = height * width
    assert (nb.key_indices == np.arange(tokens)[:, None]).any(-1).all()  # a query is in its own window
    slots = nb.query_index.shape[1]
    tile, slot = np.divmod(nb.untile_index, slots)
    np.testing.assert_array_equal(nb.query_index[tile, slot], np.arange(tokens))
    for query in range(tokens):
        in_window = nb.region_index[tile[query]][nb.mask[tile[query], slot[query]]]
        np.testing.assert_array_equal(np.sort(in_window), np.sort(expected[query]))
    # The slots of the returned probabilities point at each window key.
    regions = nb.region_index.shape[1]
    np.testing.assert_array_equal(
        nb.region_index.reshape(-1)[
            (nb.window_slot_index // (slots * regions)) * regions + nb.window_slot_index % regions
        ],
        expected,
    )
    rows, cols = np.divmod(np.arange(tokens), width)
    np.testing.assert_array_equal(nb.row_shift, rows[nb.region_index][:, None, :] - rows[nb.query_index][:, :, None])
    # Cost O(T K^2): far fewer pairs than T^2 on large maps.
    if tokens >= 1024:
        assert nb.tile_pairs < 0.05 * tokens**2


def test_the_tiled_paths_gathers_are_plain_indexing():
    """`take_tokens` and `take_per_pair` (laid out for XLA's matmuls) read what NumPy indexing reads."""
    rng = np.random.default_rng(0)
    neighbourhood = get_neighbourhood(7, 9, (3, 5))
    tokens = rng.normal(size=(2, 7 * 9, CHANNELS)).astype("float32")
    region = windowed_attention.take_tokens(tokens, neighbourhood.region_index)
    np.testing.assert_array_equal(ops.convert_to_numpy(region), tokens[:, neighbourhood.region_index])
    shift = neighbourhood.col_shift - neighbourhood.col_shift.min()  # (tiles, Bq, Rk) in [0, shifts)
    per_shift = rng.normal(size=(2, *shift.shape[:2], HEADS, shift.max() + 1)).astype("float32")
    np.testing.assert_array_equal(
        ops.convert_to_numpy(take_per_pair(per_shift, shift)),
        np.take_along_axis(per_shift, shift[None, :, :, None, :], axis=-1),
    )


def test_a_flat_window_covers_consecutive_tokens():
    nb = get_neighbourhood(3, 4, (1, 5), flat=True)
    expected = np.clip(np.arange(12) - 2, 0, 7)[:, None] + np.arange(5)
    np.testing.assert_array_equal(nb.key_indices, expected)
    rows, cols = np.divmod(np.arange(12), 4)
    np.testing.assert_array_equal(nb.col_shift, cols[nb.region_index][:, None, :] - cols[nb.query_index][:, :, None])


def siren():
    return keras.saving.serialize_keras_object(SirenScore(HEADS, hidden_units=6, omega_0=3.0, dtype="float32"))


def siren_without_vectors():
    return keras.saving.serialize_keras_object(
        SirenScore(HEADS, hidden_units=6, omega_0=3.0, head_vectors=False, dtype="float32")
    )


# Every score and the term combinations; key_dim below and above the channels takes both ways of
# gathering keys (a region of keys, or of inputs with q Wk^T), the content-only one the folded kernel.
SCORES = {
    "quadratic": lambda: {"position_score": "quadratic"},
    "gaussian": lambda: {"position_score": "gaussian"},
    "diagonal_gaussian": lambda: {
        "position_score": keras.saving.serialize_keras_object(DiagonalGaussianScore(HEADS, dtype="float32"))
    },
    "learned": lambda: {"position_score": "learned"},
    "siren": lambda: {"position_score": siren()},
    "content_only": lambda: {
        "position_score": None,
        "use_content_content": True,
        "use_position_bias": False,
        "key_dim": 3,
    },
    "content_folded": lambda: {
        "position_score": None,
        "use_content_content": True,
        "use_position_bias": False,
        "key_dim": 6,
    },
    "key_bias_only": lambda: {"position_score": None, "use_key_bias": True, "use_position_bias": False, "key_dim": 6},
    "learned_all_terms": lambda: {
        "position_score": "learned",
        "use_content_content": True,
        "use_content_position": True,
        "use_key_bias": True,
        "key_dim": 6,
    },
    "quadratic_all_terms_projected": lambda: {
        "position_score": "quadratic",
        "use_content_content": True,
        "use_content_position": True,
        "use_key_bias": True,
        "key_dim": 4,
        "position_key_projection": True,
    },
    "gaussian_content_position": lambda: {"position_score": "gaussian", "use_content_position": True, "key_dim": 5},
    "siren_content_position_key_bias": lambda: {
        "position_score": siren_without_vectors(),
        "use_content_position": True,
        "use_key_bias": True,
        "use_position_bias": False,
        "key_dim": 3,
        "position_key_projection": True,
    },
}

# (input shape, window, dilation): K in {3, 5, 7}, odd and non-square maps, dilation 2, a window
# larger than the map on one axis.
GEOMETRIES = [
    ((2, 5, 7, CHANNELS), 3, 1),
    ((1, 6, 9, CHANNELS), 5, 1),
    ((1, 7, 8, CHANNELS), 7, 1),
    ((1, 7, 9, CHANNELS), 3, 2),
    ((1, 6, 5, CHANNELS), (3, 7), (2, 1)),
]
# Each score on one geometry, every geometry on two or three scores (each a compilation on JAX: the
# file stays under a minute there).
CASES = [(score, GEOMETRIES[index % len(GEOMETRIES)]) for index, score in enumerate(sorted(SCORES))]


def layer_pair(score, shape, window, dilation, modes=(True, False), seed=0, **kwargs):
    """Layers with the same random weights on the given `windowed` modes (position-only: not separable)."""
    layers = [
        RelativeMultiHeadAttention(
            HEADS, window=window, dilation=dilation, windowed=mode, separable=False, **SCORES[score](), **kwargs
        )
        for mode in modes
    ]
    for layer in layers:
        layer.build(shape)
    randomize_weights(layers[0], seed=seed, scale=0.4)
    for layer in layers[1:]:
        layer.set_weights(layers[0].get_weights())
    return layers


def run(layer, x, **call_kwargs):
    """``layer(x, **call_kwargs)``; on JAX compiled once (eager JAX compiles every operation, which costs more)."""
    if keras.backend.backend() == "jax":
        import jax

        if not layer.built:
            layer.build(x.shape)
        return jax.jit(lambda inputs: layer(inputs, **call_kwargs))(x)
    return layer(x, **call_kwargs)


@pytest.mark.parametrize("score, geometry", CASES, ids=[f"{s}-{g[0][1]}x{g[0][2]}-k{g[1]}-d{g[2]}" for s, g in CASES])
def test_windowed_path_equals_masked_global_path_in_values_and_gradients(score, geometry):
    shape, window, dilation = geometry
    windowed, masked = layer_pair(score, shape, window, dilation)
    assert windowed.attention_mode.startswith("windowed_")
    assert masked.attention_mode in ("content", "position")
    assert_same_values_and_gradients(windowed, masked, np.random.default_rng(1).normal(size=shape).astype("float32"))


@pytest.mark.parametrize("score", ["quadratic", "learned_all_terms", "siren"])
def test_windowed_attention_is_eq8_restricted_to_natten_windows(score):
    """p_window[q, k] = p[q, k] / sum over the window of q, p from eq. (8) in NumPy; 0 elsewhere."""
    shape, window, dilation = (2, 7, 9, CHANNELS), (5, 3), (1, 2)
    windowed, masked = layer_pair(score, shape, window, dilation)
    x = np.random.default_rng(2).normal(size=shape).astype("float32")
    _, full = eq8_reference(masked, x)  # masked has the same weights; eq8_reference ignores the window
    keys = natten_keys(7, 9, window, dilation)
    in_window = np.take_along_axis(full, np.broadcast_to(keys, full.shape[:2] + keys.shape), axis=-1)
    expected = in_window / in_window.sum(-1, keepdims=True)
    for layer in (windowed, masked):
        outputs, (probabilities, key_indices) = run(layer, x, return_attention_scores=True)
        np.testing.assert_array_equal(ops.convert_to_numpy(key_indices), keys)
        np.testing.assert_allclose(ops.convert_to_numpy(probabilities), expected, atol=1e-5)
    context = np.zeros(full.shape)
    np.put_along_axis(context, np.broadcast_to(keys, full.shape[:2] + keys.shape), expected, axis=-1)
    tokens = x.reshape(2, -1, CHANNELS).astype("float64")
    weights = {v.name: ops.convert_to_numpy(v).astype("float64") for v in windowed.weights}
    reference = np.einsum("bhqk,bkc,hco->bqo", context, tokens, weights["output_kernel"]) + weights["output_bias"]
    np.testing.assert_allclose(ops.convert_to_numpy(outputs).reshape(reference.shape), reference, atol=1e-5)


@pytest.mark.parametrize("score", ["quadratic_all_terms_projected", "gaussian"])
def test_a_window_larger_than_the_map_is_global_attention(score):
    shape = (2, 4, 5, CHANNELS)
    windowed, masked = layer_pair(score, shape, 7, 1)
    plain = RelativeMultiHeadAttention(HEADS, separable=False, **SCORES[score]())
    plain.build(shape)
    plain.set_weights(windowed.get_weights())
    x = np.random.default_rng(3).normal(size=shape).astype("float32")
    _, (probabilities, key_indices) = run(windowed, x, return_attention_scores=True)
    assert tuple(key_indices.shape) == (20, 20)  # every key, once
    expected, expected_probabilities = run(plain, x, return_attention_scores=True)
    np.testing.assert_allclose(
        ops.convert_to_numpy(probabilities), ops.convert_to_numpy(expected_probabilities), atol=1e-6
    )
    for layer in (windowed, masked):
        np.testing.assert_allclose(ops.convert_to_numpy(run(layer, x)), ops.convert_to_numpy(expected), atol=1e-5)


@pytest.mark.parametrize("score", ["quadratic", "diagonal_gaussian"])
def test_separable_heads_with_a_window_equal_the_windowed_path(score):
    shape, window, dilation = (2, 6, 7, CHANNELS), (3, 5), (2, 1)
    (windowed,) = layer_pair(score, shape, window, dilation, modes=(True,))
    separable = RelativeMultiHeadAttention(HEADS, window=window, dilation=dilation, separable=True, **SCORES[score]())
    separable.build(shape)
    separable.set_weights(windowed.get_weights())
    assert separable.attention_mode == "separable"
    x = np.random.default_rng(4).normal(size=shape).astype("float32")
    assert_same_values_and_gradients(separable, windowed, x)
    (_, (p_sep, k_sep)), (_, (p_win, k_win)) = (
        run(layer, x, return_attention_scores=True) for layer in (separable, windowed)
    )
    np.testing.assert_allclose(ops.convert_to_numpy(p_sep), ops.convert_to_numpy(p_win), atol=1e-6)
    np.testing.assert_array_equal(ops.convert_to_numpy(k_sep), ops.convert_to_numpy(k_win))


@pytest.mark.parametrize("alpha", [0.05, 1e4, 1e38])
def test_far_centers_and_huge_alpha_are_finite_on_every_window_path(alpha):
    """A center 2,000 pixels away and one between pixels, up to alpha 1e38, on the tiled, separable and masked paths.

    At 1e38 every score in a far head's window but the nearest key's overflows to -inf; before the
    scores peaked in each window (`squares_from_nearest` with the window's keys), all of them did,
    and the softmax of a window with no finite score was NaN. Each path's probabilities are the
    window's softmax in float64, which at 1e38 is the limit: one-hot at the window key nearest
    the center (shared by keys as near).
    """
    shape, window, dilation = (2, 6, 7, CHANNELS), (3, 5), (2, 1)
    windowed, masked = layer_pair("quadratic", shape, window, dilation)
    separable = RelativeMultiHeadAttention(
        HEADS, window=window, dilation=dilation, separable=True, **SCORES["quadratic"]()
    )
    separable.build(shape)
    centers = np.array([[-1e3, 2e3], [0.5, -1.2]], "float32")
    for layer in (windowed, masked):
        layer.position_score.centers.assign(centers)
        layer.position_score.set_alpha(np.full(HEADS, alpha, "float32"))
    separable.set_weights(windowed.get_weights())
    assert [layer.attention_mode for layer in (windowed, masked, separable)] == [
        "windowed_position",
        "position",
        "separable",
    ]
    keys = natten_keys(6, 7, window, dilation)
    key_row, key_col = np.divmod(keys, 7)
    query_row, query_col = np.divmod(np.arange(42), 7)
    squares = (key_row - query_row[:, None] - centers[:, None, None, 0].astype("float64")) ** 2 + (
        key_col - query_col[:, None] - centers[:, None, None, 1].astype("float64")
    ) ** 2
    expected = np.exp(-np.float64(alpha) * (squares - squares.min(-1, keepdims=True)))
    expected /= expected.sum(-1, keepdims=True)
    x = np.random.default_rng(5).normal(size=shape).astype("float32")
    outputs = []
    for layer in (windowed, masked, separable):
        y, (probabilities, _) = run(layer, x, return_attention_scores=True)
        np.testing.assert_allclose(
            ops.convert_to_numpy(probabilities)[0], expected, atol=1e-6, err_msg=layer.attention_mode
        )
        y, gradients = value_and_gradients(layer, x)
        assert all(np.isfinite(ops.convert_to_numpy(g)).all() for g in gradients), layer.attention_mode
        outputs.append(ops.convert_to_numpy(y))
    for y in outputs[1:]:
        np.testing.assert_allclose(y, outputs[0], atol=1e-5)


def test_returned_scores_format_and_output_spec():
    shape = (3, 6, 5, CHANNELS)
    for score in ("content_only", "quadratic"):
        (layer,) = layer_pair(score, shape, 3, 1, modes=("auto",))
        outputs, (probabilities, key_indices) = run(layer, np.ones(shape, "float32"), return_attention_scores=True)
        assert tuple(probabilities.shape) == (3, HEADS, 30, 9) and dtype_of(probabilities) == "float32"
        assert tuple(key_indices.shape) == (30, 9) and "int" in str(key_indices.dtype)
        np.testing.assert_allclose(ops.convert_to_numpy(probabilities).sum(-1), 1.0, atol=1e-6)
        spec = layer.compute_output_spec(keras.KerasTensor(shape), return_attention_scores=True)
        assert [tuple(t.shape) for t in keras.tree.flatten(spec)] == [tuple(outputs.shape), (3, HEADS, 30, 9), (30, 9)]
        assert [t.dtype for t in keras.tree.flatten(spec)][1:] == ["float32", "int32"]
    # Inside an encoder block and a functional model, the pair passes through.
    inputs = keras.Input(shape[1:])
    block = TransformerEncoderBlock(HEADS, 8, attention_options={"window": 3})
    outputs, (probabilities, key_indices) = block(inputs, return_attention_scores=True)
    assert tuple(probabilities.shape) == (None, HEADS, 30, 9) and tuple(key_indices.shape) == (30, 9)


def test_path_choice_by_cost_and_forced_modes():
    def mode(height, width, platform="cpu", **kwargs):
        layer = RelativeMultiHeadAttention(HEADS, **kwargs)
        layer.build((None, height, width, CHANNELS))
        return layer.attention_mode_for(height, width, platform)

    content = {"use_content_content": True}
    assert mode(32, 32, window=3, **content) == "windowed_content"  # T (B + K - 1)^2 << T^2
    assert mode(3, 3, window=3, **content) == "content"  # one tile of the whole map: global with a mask is cheaper
    assert mode(3, 3, window=3, windowed=True, **content) == "windowed_content"
    assert mode(32, 32, window=3, windowed=False, **content) == "content"
    assert mode(32, 32, window=3) == "separable"  # position-only separable heads stay separable
    assert mode(32, 32, window=3, separable=False) == "windowed_position"
    assert mode(32, 32, window=3, position_score="gaussian") == "windowed_position"
    assert mode(32, 32, window=3, windowed=True) == "windowed_position"
    assert mode(16, 16, platform="gpu", window=3, position_score="gaussian") == "windowed_position"
    assert mode(32, 32, **content) == "content"  # no window: as before
    with pytest.raises(ValueError, match="platform='cuda'"):
        mode(8, 8, platform="cuda", window=3, **content)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"window": 4}, "window=4"),
        ({"window": 0}, "window=0"),
        ({"window": -3}, "window=-3"),
        ({"window": (3, 6)}, r"window=\(3, 6\)"),
        ({"window": "3"}, "window='3'"),
        ({"window": True}, "window=True"),
        ({"window": 3, "dilation": 0}, "dilation=0"),
        ({"window": 3, "dilation": (1, 2, 3)}, r"dilation=\(1, 2, 3\)"),
        ({"dilation": 2}, "dilation=2, window=None"),
        ({"windowed": True}, "windowed=True"),
        ({"window": 3, "windowed": True, "separable": True}, "separable=True"),
        ({"window": 3, "windowed": "yes"}, "windowed='yes'"),
        ({"window": 3, "rematerialize": "yes"}, "rematerialize='yes'"),
        ({"window": 3, "rematerialize": 1}, "rematerialize=1"),
        ({"window": 3, "attention_span": {"max_window": 5}}, r"window=\(3, 3\)"),
    ],
)
def test_bad_window_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RelativeMultiHeadAttention(HEADS, **kwargs)


def test_a_window_and_dilation_that_do_not_fit_the_map_and_incompatible_forced_modes():
    layer = RelativeMultiHeadAttention(HEADS, window=3, dilation=(1, 3), use_content_content=True)
    with pytest.raises(ValueError, match="dilation=3"):  # 3 * 3 > 8 columns: NATTEN's error
        layer.build((None, 9, 8, CHANNELS))
    layer.build((None, 9, 9, CHANNELS))  # fits
    with pytest.raises(ValueError, match="not separable.*separable=True"):  # at construction, before any build
        RelativeMultiHeadAttention(HEADS, window=3, position_score="gaussian", separable=True)


def test_windowed_dropout_drops_links_at_the_rate_and_never_outside_windows():
    dropout, draws, height, width = 0.5, 200, 3, 4
    tokens = height * width
    x = np.eye(tokens, dtype="float32").reshape(1, height, width, tokens)
    layer = RelativeMultiHeadAttention(
        1, output_dim=tokens, dropout=dropout, use_bias=False, window=3, windowed=True, separable=False
    )
    layer.build(x.shape)
    layer.output_kernel.assign(np.eye(tokens, dtype="float32")[None])  # the output is the dropped probabilities
    _, (probabilities, key_indices) = run(layer, x, return_attention_scores=True)
    samples = training_calls(layer, x, draws).reshape(draws, tokens, tokens)  # (draw, query, key)
    keys = ops.convert_to_numpy(key_indices)
    outside = np.ones((tokens, tokens), bool)
    np.put_along_axis(outside, keys, False, axis=1)
    assert np.all(samples[:, outside] == 0)
    kept = (np.take_along_axis(samples, np.broadcast_to(keys, (draws, *keys.shape)), axis=-1) != 0).mean(0)
    np.testing.assert_array_less(np.abs(kept - (1 - dropout)), 4.5 * np.sqrt(dropout * (1 - dropout) / draws))
    assert ops.convert_to_numpy(probabilities).min() > 1e-6


def test_mixed_precision_windowed_paths_are_finite(mixed_policy):
    shape = (2, 6, 7, CHANNELS)
    x = np.random.default_rng(5).normal(size=shape).astype("float32")
    for score in ("learned_all_terms",):  # every term of eq. (8); position-only paths: the conformance cases
        layer = RelativeMultiHeadAttention(HEADS, window=3, windowed=True, separable=False, **SCORES[score]())
        outputs, (probabilities, _) = run(layer, x, return_attention_scores=True)
        assert layer.attention_mode.startswith("windowed_")
        assert dtype_of(outputs) == mixed_policy.split("_")[1] and dtype_of(probabilities) == "float32"
        assert np.isfinite(ops.convert_to_numpy(ops.cast(outputs, "float32"))).all()
        assert np.isfinite(ops.convert_to_numpy(probabilities)).all()


def test_configs_without_window_arguments_load_as_global_attention():
    layer = RelativeMultiHeadAttention(HEADS, use_content_content=True)
    config = layer.get_config()
    assert (config["window"], config["dilation"], config["windowed"]) == (None, (1, 1), "auto")
    for key in ("window", "dilation", "windowed"):
        del config[key]  # a config saved before windows existed
    restored = RelativeMultiHeadAttention.from_config(config)
    assert restored.window is None and restored.window_spec is None
    windowed = RelativeMultiHeadAttention(HEADS, window=(3, 5), dilation=2)
    assert RelativeMultiHeadAttention.from_config(windowed.get_config()).get_config() == windowed.get_config()


@pytest.mark.parametrize(
    "score, training", [("learned_all_terms", False), ("content_folded", True), ("gaussian", True)]
)
def test_rematerialized_windowed_path_has_the_same_values_and_gradients(score, training):
    """`rematerialize` recomputes in the backward pass; with dropout, the same mask as the kept tensors had.

    Position-only heads (gaussian) draw one mask for the batch, content heads one per example.
    """
    shape = (2, 6, 7, CHANNELS)
    layers = []
    for rematerialize in (False, True):
        keras.utils.set_random_seed(3)  # the same dropout seed for both layers
        layers.append(
            RelativeMultiHeadAttention(
                HEADS,
                window=3,
                windowed=True,
                separable=False,
                dropout=0.3,
                rematerialize=rematerialize,
                **SCORES[score](),
            )
        )
        layers[-1].build(shape)
    randomize_weights(layers[0], scale=0.4)
    layers[1].set_weights(layers[0].get_weights())
    x = np.random.default_rng(4).normal(size=shape).astype("float32")
    assert_same_values_and_gradients(layers[1], layers[0], x, atol=1e-6, training=training)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="residuals are read from a jax.vjp function")
def test_rematerialized_windowed_path_keeps_no_per_head_tensor_for_the_backward_pass():
    """With `rematerialize`, nothing larger than the tile probabilities, the inputs or a kernel is kept.

    Without it, the per-head (batch, T, heads, C) tensors are kept: the check discriminates.
    """
    shape = (2, 8, 8, 32)
    biggest = {}
    for rematerialize in (False, True):
        layer = RelativeMultiHeadAttention(
            4,
            window=3,
            windowed=True,
            position_score=None,
            use_content_content=True,
            use_position_bias=False,
            rematerialize=rematerialize,
        )
        layer.build(shape)
        biggest[rematerialize] = largest_backward_residual(layer, shape)
    tile_probabilities = shape[0] * 4 * get_neighbourhood(8, 8, (3, 3)).tile_pairs  # (batch, tiles, Bq, heads, Rk)
    allowed = max(tile_probabilities, int(np.prod(shape)), *(int(np.prod(v.shape)) for v in layer.trainable_variables))
    assert biggest[True] <= allowed < biggest[False]


def test_rematerialize_is_kept_in_the_config():
    layer = RelativeMultiHeadAttention(HEADS, window=3, use_content_content=True, rematerialize=True)
    config = layer.get_config()
    assert config["rematerialize"] is True
    assert RelativeMultiHeadAttention.from_config(config).rematerialize is True
    del config["rematerialize"]  # a config saved before the option existed
    assert RelativeMultiHeadAttention.from_config(config).rematerialize is False


@pytest.mark.parametrize("terms", [{"use_content_content": True}, {}], ids=["content_content", "content_position"])
def test_folded_learned_content_position_equals_the_masked_global_path(terms):
    """Queries folded into the kernels (`folds_queries`): the content-position term against per-axis shift tables."""
    shape = (2, 6, 7, CHANNELS)
    windowed, masked = layer_pair(
        "learned", shape, 3, 1, use_content_position=True, use_position_bias=False, key_dim=16, **terms
    )
    nb = get_neighbourhood(6, 7, (3, 3))
    assert windowed_attention.folds_queries(
        windowed._score_weights(), (None, 42, CHANNELS), nb, windowed.position_score
    )
    assert_same_values_and_gradients(windowed, masked, np.random.default_rng(2).normal(size=shape).astype("float32"))
