"""Specifications of the differentiable attention span (AttentionSpan on RelativeMultiHeadAttention)."""

import keras
import numpy as np
import pytest
from keras import ops
from support import dtype_of, randomize_weights, value_and_gradients

from keras_attnconv.layers import AttentionSpan, LearnedRelativeScore, RelativeMultiHeadAttention

HEIGHT, WIDTH, CHANNELS, HEADS = 4, 5, 6, 3
SCORES = {
    "quadratic": lambda: {"position_score": "quadratic"},
    "siren": lambda: {"position_score": "siren"},
    "learned_content": lambda: {
        "position_score": LearnedRelativeScore(HEADS, embedding_dim=4),
        "key_dim": 4,
        "use_content_content": True,
        "use_content_position": True,
    },
}


def inputs(seed=0, batch=2):
    return np.random.default_rng(seed).normal(size=(batch, HEIGHT, WIDTH, CHANNELS)).astype("float32")


def attention(score="learned_content", span=None, **kwargs):
    """A layer with random weights (seeded), optionally with a span; same non-span weights for any span."""
    layer = RelativeMultiHeadAttention(HEADS, **SCORES[score](), attention_span=span, **kwargs)
    layer.build((None, HEIGHT, WIDTH, CHANNELS))
    span_variables = {id(v) for v in layer.attention_span.weights} if layer.attention_span else set()
    rng = np.random.default_rng(1)
    for variable in layer.weights:
        if id(variable) not in span_variables:
            variable.assign(rng.normal(0.0, 0.3, variable.shape).astype("float32"))
    return layer


def set_span(layer, centers, sigmas):
    span = layer.attention_span
    span.span_center.assign(np.asarray(centers, "float32"))
    sigmas = np.asarray(sigmas, "float64") - span.min_sigma
    span.span_raw_sigma.assign((sigmas + np.log(-np.expm1(-sigmas))).astype("float32"))


def probabilities(layer, x):
    outputs, probs = layer(x, return_attention_scores=True)
    return ops.convert_to_numpy(outputs), ops.convert_to_numpy(probs)


def gaussian_reference(centers, sigmas, span_dims):
    """g_h(delta) straight from the definition: (heads, T, T), float64."""
    rows, cols = np.divmod(np.arange(HEIGHT * WIDTH), WIDTH)
    if span_dims == 2:
        delta = np.stack([rows[None, :] - rows[:, None], cols[None, :] - cols[:, None]], axis=-1)
    else:
        index = np.arange(HEIGHT * WIDTH)
        delta = (index[None, :] - index[:, None])[..., None]
    z = (delta[None] - np.asarray(centers)[:, None, None, :]) / np.asarray(sigmas)[:, None, None, :]
    return np.exp(-0.5 * np.sum(z**2, axis=-1))


@pytest.mark.parametrize("span_dims", [1, 2])
def test_modulation_shapes(span_dims):
    span = AttentionSpan(HEADS, span_dims=span_dims)
    span.build()
    assert tuple(span.log_modulation(HEIGHT, WIDTH).shape) == (HEADS, HEIGHT * WIDTH, HEIGHT * WIDTH)
    assert span.compute_output_shape((2, HEIGHT, WIDTH, CHANNELS)) == (HEADS, HEIGHT * WIDTH, HEIGHT * WIDTH)
    assert tuple(span.sigma.shape) == (HEADS, span_dims)
    if span_dims == 2:
        rows, columns = span.axis_log_modulation(HEIGHT, WIDTH)
        assert (tuple(rows.shape), tuple(columns.shape)) == ((HEADS, HEIGHT, HEIGHT), (HEADS, WIDTH, WIDTH))
    np.testing.assert_allclose(ops.convert_to_numpy(span.sigma), 4.0, rtol=1e-6)  # the initial sigma


@pytest.mark.parametrize("score", sorted(SCORES))
@pytest.mark.parametrize("span", [{"threshold": 0.1}, {"threshold": None}, {"span_dims": 1}])
def test_a_very_wide_span_equals_the_unmodulated_layer(score, span):
    x = inputs()
    plain_outputs, plain_probs = probabilities(attention(score), x)
    outputs, probs = probabilities(attention(score, span={"initial_sigma": 1e6, **span}), x)
    np.testing.assert_allclose(probs, plain_probs, atol=1e-6)
    np.testing.assert_allclose(outputs, plain_outputs, atol=1e-5)


@pytest.mark.parametrize("span_dims, threshold", [(2, 0.1), (2, None), (1, 0.1), (1, 0.3)])
def test_modulation_multiplies_probabilities_by_g_and_masks_under_the_threshold(span_dims, threshold):
    """p_span ∝ p * g * [g >= threshold] (the key of largest g always kept), exact zeros outside."""
    x = inputs(seed=2)
    _, plain = probabilities(attention(), x)
    layer = attention(span={"span_dims": span_dims, "threshold": threshold})
    rng = np.random.default_rng(4)
    centers = rng.normal(0.0, 1.5, (HEADS, span_dims))
    sigmas = rng.uniform(0.7, 2.5, (HEADS, span_dims))
    set_span(layer, centers, sigmas)
    _, probs = probabilities(layer, x)

    g = gaussian_reference(centers, sigmas, span_dims)
    keep = np.ones_like(g, bool) if threshold is None else (g >= threshold) | (g == g.max(-1, keepdims=True))
    expected = plain * g[None] * keep[None]
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(probs, expected, atol=1e-6)
    assert np.all(probs[:, ~keep] == 0.0)
    if threshold is not None:
        assert (~keep).any(), "the test needs keys outside the span"


def test_a_narrow_span_puts_almost_all_probability_at_its_center():
    x = inputs(seed=5)
    layer = attention(span={"threshold": None})
    centers = np.array([[0, 0], [1, -1], [-2, 2]])
    set_span(layer, centers, np.full((HEADS, 2), 0.2))
    _, probs = probabilities(layer, x)
    rows, cols = np.divmod(np.arange(HEIGHT * WIDTH), WIDTH)
    for head, (dr, dc) in enumerate(centers):
        for query in range(HEIGHT * WIDTH):
            row, col = rows[query] + dr, cols[query] + dc
            if 0 <= row < HEIGHT and 0 <= col < WIDTH:
                assert np.all(probs[:, head, query, row * WIDTH + col] > 0.99)


@pytest.mark.parametrize("span_dims", [1, 2])
@pytest.mark.parametrize("center", [0.5, 1e3])
def test_a_collapsed_span_stays_finite_in_values_and_gradients(span_dims, center):
    """sigma at its floor, center between pixels or far outside: no key reaches the threshold."""
    layer = attention(span={"span_dims": span_dims, "min_sigma": 0.05})
    model = keras.Sequential(
        [keras.Input((HEIGHT, WIDTH, CHANNELS)), layer, keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)]
    )
    layer.attention_span.span_center.assign(np.full((HEADS, span_dims), center, "float32"))
    layer.attention_span.span_raw_sigma.assign(np.full((HEADS, span_dims), -1e4, "float32"))
    x = inputs(seed=6)
    _, probs = probabilities(layer, x)
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
    assert np.all((probs > 0).sum(-1) >= 1)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=True)
    loss = model.train_on_batch(x, np.ones((2, 3), "float32"))
    assert np.isfinite(loss)
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_a_span_without_threshold_keeps_the_separable_fast_path():
    x = inputs(seed=7)
    span = {"threshold": None, "initial_sigma": 1.5}
    fast = attention("quadratic", span=span)
    general = attention("quadratic", span=span, separable=False)
    assert (fast.attention_mode, general.attention_mode) == ("separable", "position")
    for layer in (fast, general):
        set_span(layer, [[0.5, -1.0], [0.0, 2.0], [-1.5, 0.3]], [[1.0, 2.0], [0.6, 1.2], [3.0, 0.8]])
    fast_outputs, fast_probs = probabilities(fast, x)
    general_outputs, general_probs = probabilities(general, x)
    np.testing.assert_allclose(fast_probs, general_probs, atol=1e-6)
    np.testing.assert_allclose(fast_outputs, general_outputs, atol=1e-5)


def test_a_thresholded_span_uses_the_general_path_and_rejects_separable_true():
    assert attention("quadratic", span={"threshold": 0.1}).attention_mode == "position"
    with pytest.raises(ValueError, match="attention span with a threshold"):
        attention("quadratic", span={"threshold": 0.1}, separable=True)


def span_model(span_dims=2):
    inputs = keras.Input((HEIGHT, WIDTH, CHANNELS))
    layer = RelativeMultiHeadAttention(
        HEADS, position_score="quadratic", attention_span={"span_dims": span_dims, "initial_sigma": 1.5}
    )
    x = keras.layers.GlobalAveragePooling2D()(layer(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    randomize_weights(model, seed=8)
    return model


def test_config_round_trip_and_keras_file_keep_the_span(tmp_path):
    model = span_model(span_dims=1)
    layer = model.layers[1]
    clone = RelativeMultiHeadAttention.from_config(layer.get_config())
    assert clone.attention_span.get_config() == layer.attention_span.get_config()
    path = tmp_path / "span.keras"
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    x = inputs(seed=9)
    np.testing.assert_array_equal(ops.convert_to_numpy(restored(x)), ops.convert_to_numpy(model(x)))
    np.testing.assert_array_equal(
        ops.convert_to_numpy(restored.layers[1].attention_span.sigma), ops.convert_to_numpy(layer.attention_span.sigma)
    )


def test_jit_compiled_training_step_matches_eager_and_learns_the_span():
    x, y = inputs(seed=10, batch=4), np.array([0, 1, 2, 1])
    models = []
    for jit in (False, True):
        model = span_model()
        model.compile(
            optimizer=keras.optimizers.SGD(0.5),
            jit_compile=jit,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        models.append(model)
    models[1].set_weights(models[0].get_weights())
    before = ops.convert_to_numpy(models[0].layers[1].attention_span.span_raw_sigma).copy()
    losses = [float(m.train_on_batch(x, y)) for m in models]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    for eager, jitted in zip(models[0].get_weights(), models[1].get_weights()):
        np.testing.assert_allclose(jitted, eager, atol=1e-5)
    assert not np.array_equal(ops.convert_to_numpy(models[0].layers[1].attention_span.span_raw_sigma), before)


def test_mixed_precision_keeps_the_span_in_float32(mixed_policy):
    layer = attention(span={"initial_sigma": 1.0})
    outputs, probs = layer(inputs(seed=11), return_attention_scores=True)
    assert dtype_of(outputs) == mixed_policy.split("_")[1]
    assert dtype_of(probs) == "float32"
    assert layer.attention_span.span_raw_sigma.dtype == "float32"
    assert np.isfinite(ops.convert_to_numpy(ops.cast(outputs, "float32"))).all()
    assert np.any(ops.convert_to_numpy(probs) == 0.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"span_dims": 3}, "span_dims=3"),
        ({"initial_sigma": 0.0}, "initial_sigma=0.0"),
        ({"initial_sigma": -2.0}, "initial_sigma=-2.0"),
        ({"initial_sigma": float("nan")}, "initial_sigma=nan"),
        ({"initial_sigma": 0.01, "min_sigma": 0.05}, "initial_sigma=0.01"),
        ({"min_sigma": 0}, "min_sigma=0"),
        ({"threshold": 0.0}, "threshold=0.0"),
        ({"threshold": 1.5}, "threshold=1.5"),
        ({"threshold": "0.1"}, "threshold='0.1'"),
        ({"max_window": 4}, "max_window=4"),
        ({"max_window": (3, 0)}, r"max_window=\(3, 0\)"),
        ({"max_window": (3, 5), "span_dims": 1}, r"max_window=\(3, 5\)"),
    ],
)
def test_bad_span_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AttentionSpan(HEADS, **kwargs)
    with pytest.raises(ValueError, match=message):
        RelativeMultiHeadAttention(HEADS, attention_span=kwargs)


def test_a_span_of_the_wrong_kind_or_head_count_is_rejected():
    with pytest.raises(ValueError, match="attention_span='wide'"):
        RelativeMultiHeadAttention(HEADS, attention_span="wide")
    with pytest.raises(
        ValueError, match=f"one span per head .*num_heads={HEADS}.*Received: attention_span with num_heads=2$"
    ):
        RelativeMultiHeadAttention(HEADS, attention_span=AttentionSpan(2))
    with pytest.raises(ValueError, match="has no per-axis terms"):
        AttentionSpan(HEADS, span_dims=1).axis_log_modulation(2, 2)


def test_a_1d_span_on_a_sequence_is_the_2d_span_along_its_only_axis():
    """A sequence is a (batch, 1, length, channels) map: the 1-D offset is the column shift."""
    x = np.random.default_rng(12).normal(size=(2, 1, 9, CHANNELS)).astype("float32")
    probs = []
    for span_dims, centers, sigmas in (
        (1, [[1.5], [-2.0], [0.0]], [[1.0], [2.5], [0.7]]),
        (2, [[0, 1.5], [0, -2.0], [0, 0.0]], [[1, 1.0], [1, 2.5], [1, 0.7]]),
    ):
        keras.utils.set_random_seed(13)
        layer = RelativeMultiHeadAttention(HEADS, position_score="quadratic", attention_span={"span_dims": span_dims})
        layer.build(x.shape)
        set_span(layer, centers, sigmas)
        probs.append(ops.convert_to_numpy(layer(x, return_attention_scores=True)[1]))
    np.testing.assert_allclose(probs[0], probs[1], atol=1e-6)
    assert np.any(probs[0] == 0.0)


@pytest.mark.parametrize("span_dims, max_window", [(2, 3), (2, (3, 5)), (1, 7)])
def test_a_span_with_max_window_runs_windowed_and_equals_the_global_span_path(span_dims, max_window):
    """Keys outside max_window or under the threshold get exactly zero probability on both paths."""
    span = {"span_dims": span_dims, "max_window": max_window, "threshold": 0.3}
    layers = [attention(span=span, windowed=mode) for mode in (True, False)]
    assert [layer.attention_mode for layer in layers] == ["windowed_content", "content"]
    rng = np.random.default_rng(14)
    centers, sigmas = rng.normal(0.0, 1.0, (HEADS, span_dims)), rng.uniform(0.6, 1.5, (HEADS, span_dims))
    for layer in layers:
        set_span(layer, centers, sigmas)
    x = inputs(seed=15)
    (windowed_y, windowed_grads), (global_y, global_grads) = (value_and_gradients(layer, x) for layer in layers)
    np.testing.assert_allclose(ops.convert_to_numpy(windowed_y), ops.convert_to_numpy(global_y), atol=1e-5)
    for a, b in zip(windowed_grads, global_grads):
        np.testing.assert_allclose(ops.convert_to_numpy(a), ops.convert_to_numpy(b), atol=1e-5, rtol=1e-5)
    (_, (probs, keys)), (_, (global_probs, global_keys)) = (layer(x, return_attention_scores=True) for layer in layers)
    probs, keys = ops.convert_to_numpy(probs), ops.convert_to_numpy(keys)
    np.testing.assert_allclose(probs, ops.convert_to_numpy(global_probs), atol=1e-6)
    np.testing.assert_array_equal(keys, ops.convert_to_numpy(global_keys))
    # The window: max_window keys per query (NATTEN's clamped neighbourhood), within reach of the query.
    rows, cols = np.divmod(np.arange(HEIGHT * WIDTH), WIDTH)
    if span_dims == 2:
        reach = np.broadcast_to(max_window, (2,))
        assert keys.shape[1] == reach[0] * reach[1]
        assert np.all(np.abs(rows[keys] - rows[:, None]) <= reach[0] - 1)
        assert np.all(np.abs(cols[keys] - cols[:, None]) <= reach[1] - 1)
    else:
        assert keys.shape[1] == max_window and np.all(np.abs(keys - np.arange(HEIGHT * WIDTH)[:, None]) < max_window)
    # In the window: g under the threshold -> exactly 0, except the key of largest g.
    g = np.take_along_axis(
        gaussian_reference(centers, sigmas, span_dims), np.broadcast_to(keys, (HEADS, *keys.shape)), axis=-1
    )
    kept = (g >= 0.3) | (g == g.max(-1, keepdims=True))
    assert (~kept).any() and np.all(probs[:, ~kept] == 0.0)
    assert np.all(probs[:, kept] > 0.0)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)


def test_max_window_round_trips_and_keeps_old_span_configs():
    layer = attention(span={"span_dims": 1, "max_window": 5}, windowed=True)
    config = layer.get_config()
    clone = RelativeMultiHeadAttention.from_config(config)
    assert clone.attention_span.max_window == (5,) and clone.get_config() == config
    assert clone.window_spec == ((1, 5), (1, 1), True)
    old = AttentionSpan(HEADS).get_config()
    del old["max_window"]  # a span saved before max_window existed
    assert AttentionSpan.from_config(old).max_window is None
    with pytest.raises(ValueError, match="not separable.*separable=True"):
        attention("quadratic", span={"threshold": None, "max_window": 3}, separable=True)
