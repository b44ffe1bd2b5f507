"""Specifications of RelativeMultiHeadAttention: eq. (8) exactness and Keras behaviour."""

import itertools

import keras
import numpy as np
import pytest
from conftest import randomize_weights
from keras import ops

from keras_attnconv.layers import LearnedRelativeScore, RelativeMultiHeadAttention

TERMS = ("use_content_content", "use_content_position", "use_key_bias", "use_position_bias")


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def relative_encoding_reference(score, delta):
    """r_delta straight from the definitions, for every (q, k): (T, T, D_p)."""
    d1, d2 = delta[..., 0], delta[..., 1]
    if score.__class__.__name__ == "QuadraticScore":
        return np.stack([d1**2 + d2**2, d1, d2], axis=-1).astype("float64")
    rows = ops.convert_to_numpy(score.row_embeddings)[d1 + score.row_size - 1]
    cols = ops.convert_to_numpy(score.col_embeddings)[d2 + score.col_size - 1]
    return np.concatenate([rows, cols], axis=-1).astype("float64")


def head_vectors_reference(score):
    """v_h of eq. (8) from the weights: (heads, D_p)."""
    if score.__class__.__name__ == "QuadraticScore":
        alpha, centers = ops.convert_to_numpy(score.alpha), ops.convert_to_numpy(score.centers)
        return -alpha[:, None] * np.concatenate([np.ones((len(alpha), 1)), -2 * centers], axis=-1)
    return np.concatenate([ops.convert_to_numpy(score.row_head_vectors),
                           ops.convert_to_numpy(score.col_head_vectors)], axis=-1)


def eq8_reference(layer, x):
    """Direct NumPy implementation of eq. (8) with the layer's weights (float64)."""
    batch, height, width, channels = x.shape
    tokens = x.reshape(batch, height * width, channels).astype("float64")
    w = {v.path.split("/")[-1]: ops.convert_to_numpy(v).astype("float64") for v in layer.weights}
    rows, cols = np.divmod(np.arange(height * width), width)
    coords = np.stack([rows, cols], -1)
    delta = coords[None, :, :] - coords[:, None, :]
    scores = np.zeros((batch, layer.num_heads, height * width, height * width))
    s = layer._scale
    if "query_kernel" in w:
        q = np.einsum("btc,chd->bthd", tokens, w["query_kernel"]) + w.get("query_bias", 0)
    if "key_kernel" in w:
        k = np.einsum("btc,chd->bthd", tokens, w["key_kernel"]) + w.get("key_bias", 0)
    if layer.use_content_content:
        scores += s * np.einsum("bqhd,bkhd->bhqk", q, k)
    if layer.use_key_bias:
        scores += s * np.einsum("hd,bkhd->bhk", w["u"], k)[:, :, None, :]
    if layer.use_content_position or layer.use_position_bias:
        r = relative_encoding_reference(layer.position_score, delta)
    if layer.use_content_position:
        if layer.position_key_projection:
            projected = np.einsum("bqhd,hde->bqhe", q, w["position_key_kernel"])
        else:
            projected = q[..., : r.shape[-1]]  # W_hat = identity padded to key_dim
        scores += s * np.einsum("bqhe,qke->bhqk", projected, r)
    if layer.use_position_bias:
        scores += np.einsum("hd,qkd->hqk", head_vectors_reference(layer.position_score), r)[None]
    probs = np_softmax(scores)
    context = np.einsum("bhqk,bkc->bqhc", probs, tokens)
    out = np.einsum("bqhc,hco->bqo", context, w["output_kernel"]) + w.get("output_bias", 0)
    return out.reshape(batch, height, width, -1), probs


TERM_SETS = [
    dict(zip(TERMS, flags)) for flags in itertools.product([False, True], repeat=4) if any(flags)
]


@pytest.mark.parametrize("terms", TERM_SETS, ids=lambda t: "+".join(k[4:] for k, v in t.items() if v))
@pytest.mark.parametrize("score", ["quadratic", "learned"])
def test_layer_equals_numpy_eq8(terms, score):
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 6)).astype("float32")
    position_score = score
    if score == "learned" and (terms["use_content_position"] or terms["use_position_bias"]):
        position_score = LearnedRelativeScore(3, embedding_dim=4, max_position=5,
                                              head_vectors=terms["use_position_bias"])
    layer = RelativeMultiHeadAttention(num_heads=3, output_dim=5, key_dim=4, position_score=position_score, **terms)
    layer.build(x.shape)
    randomize_weights(layer, scale=0.5)
    outputs, probs = layer(x, return_attention_scores=True)
    expected, expected_probs = eq8_reference(layer, x)
    np.testing.assert_allclose(ops.convert_to_numpy(probs), expected_probs, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(outputs), expected, atol=1e-5)


@pytest.mark.parametrize("output_dim", [2, 6, 9])
@pytest.mark.parametrize("projection", [False, True])
def test_contraction_orders_and_position_key_projection_match_eq8(output_dim, projection):
    # output_dim < input_dim takes the values-first contraction order.
    x = np.random.default_rng(1).normal(size=(2, 4, 3, 6)).astype("float32")
    layer = RelativeMultiHeadAttention(num_heads=2, output_dim=output_dim, use_content_content=True,
                                       use_content_position=True, position_key_projection=projection,
                                       content_scale=0.7)
    layer.build(x.shape)
    randomize_weights(layer, seed=5)
    expected, _ = eq8_reference(layer, x)
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x)), expected, atol=1e-5)


def test_position_only_probabilities_do_not_depend_on_the_batch():
    x = np.random.default_rng(2).normal(size=(3, 4, 4, 5)).astype("float32")
    layer = RelativeMultiHeadAttention(num_heads=4, position_score="gaussian")
    outputs, probs = layer(x, return_attention_scores=True)
    probs = ops.convert_to_numpy(probs)
    assert probs.shape == (3, 4, 16, 16)
    np.testing.assert_array_equal(probs[0], probs[2])
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x[1:2]))[0], ops.convert_to_numpy(outputs)[1], atol=1e-6)


def test_output_shape_and_probabilities_contract():
    layer = RelativeMultiHeadAttention(num_heads=2, output_dim=7, use_content_content=True)
    inputs = keras.Input((4, 6, 3))
    outputs, probs = layer(inputs, return_attention_scores=True)
    assert tuple(outputs.shape) == (None, 4, 6, 7)
    assert tuple(probs.shape) == (None, 2, 24, 24)
    real_out, real_probs = layer(np.ones((2, 4, 6, 3), "float32"), return_attention_scores=True)
    assert tuple(real_out.shape) == (2, 4, 6, 7)
    np.testing.assert_allclose(ops.convert_to_numpy(real_probs).sum(-1), 1.0, atol=1e-6)


def test_attention_dropout_is_only_active_in_training():
    x = np.random.default_rng(3).normal(size=(2, 4, 4, 3)).astype("float32")
    layer = RelativeMultiHeadAttention(num_heads=2, dropout=0.5)
    inference = ops.convert_to_numpy(layer(x, training=False))
    np.testing.assert_array_equal(inference, ops.convert_to_numpy(layer(x)))
    assert not np.allclose(ops.convert_to_numpy(layer(x, training=True)), inference)


def full_layer(**overrides):
    options = dict(num_heads=2, output_dim=5, use_content_content=True, use_content_position=True,
                   use_key_bias=True, position_score=LearnedRelativeScore(2, embedding_dim=4), key_dim=4)
    options.update(overrides)
    return RelativeMultiHeadAttention(**options)


def test_get_config_round_trip_rebuilds_the_same_function():
    x = np.random.default_rng(4).normal(size=(2, 3, 3, 4)).astype("float32")
    layer = full_layer(dropout=0.2, content_scale=0.5)
    layer.build(x.shape)
    randomize_weights(layer)
    config = layer.get_config()
    clone = RelativeMultiHeadAttention.from_config(config)
    clone.build(x.shape)
    clone.set_weights(layer.get_weights())
    assert clone.get_config() == config
    np.testing.assert_allclose(ops.convert_to_numpy(clone(x)), ops.convert_to_numpy(layer(x)), atol=1e-6)


def small_model(attention):
    inputs = keras.Input((4, 4, 3))
    x = attention(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


def test_keras_file_save_and_load_with_safe_mode(tmp_path):
    model = small_model(full_layer())
    randomize_weights(model)
    x = np.random.default_rng(5).normal(size=(2, 4, 4, 3)).astype("float32")
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(ops.convert_to_numpy(restored(x)), ops.convert_to_numpy(model(x)))


@pytest.mark.parametrize("score", ["quadratic", "learned_content"])
def test_jit_compiled_training_step_matches_eager(score):
    layer_args = {"quadratic": {}, "learned_content": {}}[score]
    make = (lambda: full_layer()) if score == "learned_content" else (
        lambda: RelativeMultiHeadAttention(num_heads=2, **layer_args))
    x = np.random.default_rng(6).normal(size=(4, 4, 4, 3)).astype("float32")
    y = np.array([0, 1, 2, 1])
    models = []
    for jit in (False, True):
        keras.utils.set_random_seed(7)
        model = small_model(make())
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit)
        models.append(model)
    models[1].set_weights(models[0].get_weights())
    losses = [float(m.train_on_batch(x, y)) for m in models]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    for eager, jitted in zip(models[0].get_weights(), models[1].get_weights()):
        np.testing.assert_allclose(jitted, eager, atol=1e-5)


def test_mixed_precision_keeps_scores_in_float32(mixed_policy):
    x = np.random.default_rng(8).normal(size=(2, 4, 4, 6)).astype("float32")
    layer = full_layer()
    outputs, probs = layer(x, return_attention_scores=True)
    assert layer.compute_dtype == mixed_policy.split("_")[1]
    assert outputs.dtype == layer.compute_dtype
    assert probs.dtype == "float32"
    assert layer.position_score.row_embeddings.dtype == "float32"
    assert layer.position_score.position_scores(4, 4).dtype == "float32"
    assert np.isfinite(ops.convert_to_numpy(ops.cast(outputs, "float32"))).all()

    keras.mixed_precision.set_dtype_policy("float32")
    reference = full_layer()
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    _, reference_probs = reference(x, return_attention_scores=True)
    np.testing.assert_allclose(ops.convert_to_numpy(probs), ops.convert_to_numpy(reference_probs), atol=0.05)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_heads": 0}, "num_heads=0"),
    ({"num_heads": -3}, "num_heads=-3"),
    ({"num_heads": 2, "position_score": "gausian"}, "Did you mean 'gaussian'"),
    ({"num_heads": 2, "use_position_bias": False}, "At least one score term"),
    ({"num_heads": 2, "position_score": None}, "position_score=None"),
    ({"num_heads": 2, "dropout": 1.5}, "dropout=1.5"),
    ({"num_heads": 2, "dropout": "x"}, "dropout='x'"),
    ({"num_heads": 2, "content_scale": -1.0}, "content_scale=-1.0"),
    ({"num_heads": 2, "key_dim": 0}, "key_dim=0"),
    ({"num_heads": 2, "position_score": LearnedRelativeScore(3, embedding_dim=4)}, "num_heads=2"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        layer = RelativeMultiHeadAttention(**kwargs)
        layer.build((None, 4, 4, 3))


@pytest.mark.parametrize("shape, message", [
    ((2, 16, 3), "4-D input"),
    ((None, None, 4, 3), "must be known"),
    ((None, 4, None, 3), "must be known"),
])
def test_bad_input_shapes_are_rejected(shape, message):
    with pytest.raises(ValueError, match=message):
        RelativeMultiHeadAttention(num_heads=2).build(shape)


def test_input_with_other_channels_than_built_is_named():
    layer = RelativeMultiHeadAttention(num_heads=2)
    layer(np.ones((1, 4, 4, 8), "float32"))
    with pytest.raises(ValueError, match=r"expected axis -1 of input shape to have value 8.*\(1, 4, 4, 4\)"):
        layer(np.ones((1, 4, 4, 4), "float32"))


@pytest.mark.parametrize("kwargs", [
    {"position_score": "quadratic"},
    {"position_score": "quadratic", "separable": False},
    {"position_score": "learned", "use_content_content": True, "use_content_position": True, "key_dim": 4},
], ids=["separable", "general", "content"])
@pytest.mark.parametrize("dtype", ["uint8", "int32"])
def test_integer_inputs_are_values_not_zeros(kwargs, dtype):
    # Pixel values 0..255 in uint8 must attend like the same values in float32 (not like zeros).
    x = np.random.default_rng(4).integers(0, 256, size=(2, 4, 4, 3))
    layer = RelativeMultiHeadAttention(num_heads=2, **kwargs)
    layer.build(x.shape)
    randomize_weights(layer, scale=0.05)
    expected = ops.convert_to_numpy(layer(x.astype("float32")))
    outputs = layer(x.astype(dtype))
    assert outputs.dtype == "float32"
    np.testing.assert_allclose(ops.convert_to_numpy(outputs), expected, rtol=1e-5, atol=1e-4)
    assert np.abs(expected).max() > 1.0
