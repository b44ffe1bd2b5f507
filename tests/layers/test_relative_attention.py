"""Specifications of RelativeMultiHeadAttention: eq. (8) exactness and Keras behaviour.

Config and `.keras` round trips, XLA and dtype policies of every path: test_keras_conformance.py.
"""

import itertools

import keras
import numpy as np
import pytest
from keras import ops
from support import assert_path_keeps_values_and_gradients, dtype_of, eq8_reference, randomize_weights

from keras_attnconv.layers import LearnedRelativeScore, RelativeMultiHeadAttention, SirenScore, relative_attention

TERMS = ("use_content_content", "use_content_position", "use_key_bias", "use_position_bias")


TERM_SETS = [dict(zip(TERMS, flags)) for flags in itertools.product([False, True], repeat=4) if any(flags)]


# Scores whose encoding fits key_dim=4, with or without the per-head vectors of the position-bias term.
# SIREN's omega_0 is small so that float32 sines of the random weights stay within 1e-5 of float64 ones.
SCORES = {
    "quadratic": lambda head_vectors: "quadratic",
    "learned": lambda head_vectors: LearnedRelativeScore(3, embedding_dim=4, max_position=5, head_vectors=head_vectors),
    "siren": lambda head_vectors: SirenScore(3, hidden_units=4, omega_0=3.0, head_vectors=head_vectors),
}


@pytest.mark.parametrize("terms", TERM_SETS, ids=lambda t: "+".join(k[4:] for k, v in t.items() if v))
@pytest.mark.parametrize("score", sorted(SCORES))
def test_layer_equals_numpy_eq8(terms, score):
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 6)).astype("float32")
    position_score = SCORES[score](terms["use_position_bias"])
    layer = RelativeMultiHeadAttention(num_heads=3, output_dim=5, key_dim=4, position_score=position_score, **terms)
    layer.build(x.shape)
    randomize_weights(layer, scale=0.5)
    outputs, probs = layer(x, return_attention_scores=True)
    expected, expected_probs = eq8_reference(layer, x)
    np.testing.assert_allclose(ops.convert_to_numpy(probs), expected_probs, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(outputs), expected, atol=1e-5)


@pytest.mark.parametrize("output_dim", [2, 6, 9])
@pytest.mark.parametrize("projection", [False, True])
@pytest.mark.parametrize("score", ["quadratic", "learned"])
def test_contraction_orders_and_position_key_projection_match_eq8(output_dim, projection, score):
    # output_dim < input_dim takes the values-first contraction order. The learned encoding's
    # content-position term is folded into the query projection, with W_hat or without.
    x = np.random.default_rng(1).normal(size=(2, 4, 3, 6)).astype("float32")
    layer = RelativeMultiHeadAttention(
        num_heads=2,
        output_dim=output_dim,
        position_score=score,
        use_content_content=True,
        use_content_position=True,
        position_key_projection=projection,
        content_scale=0.7,
    )
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
    options = dict(
        num_heads=2,
        output_dim=5,
        use_content_content=True,
        use_content_position=True,
        use_key_bias=True,
        position_score=LearnedRelativeScore(2, embedding_dim=4),
        key_dim=4,
    )
    options.update(overrides)
    return RelativeMultiHeadAttention(**options)


def small_model(attention):
    inputs = keras.Input((4, 4, 3))
    x = attention(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


@pytest.mark.parametrize("score", ["quadratic", "learned_content"])
def test_jit_compiled_training_step_matches_eager(score):
    make = {"quadratic": lambda: RelativeMultiHeadAttention(num_heads=2), "learned_content": full_layer}[score]
    x = np.random.default_rng(6).normal(size=(4, 4, 4, 3)).astype("float32")
    y = np.array([0, 1, 2, 1])
    models = []
    for jit in (False, True):
        keras.utils.set_random_seed(7)
        model = small_model(make())
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit,
        )
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
    assert dtype_of(outputs) == layer.compute_dtype
    assert dtype_of(probs) == "float32"
    assert layer.position_score.row_embeddings.dtype == "float32"
    assert dtype_of(layer.position_score.position_scores(4, 4)) == "float32"
    assert np.isfinite(ops.convert_to_numpy(ops.cast(outputs, "float32"))).all()

    keras.mixed_precision.set_dtype_policy("float32")
    reference = full_layer()
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    _, reference_probs = reference(x, return_attention_scores=True)
    np.testing.assert_allclose(ops.convert_to_numpy(probs), ops.convert_to_numpy(reference_probs), atol=0.05)


@pytest.mark.parametrize(
    "kwargs, message",
    [
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
        (
            {
                "num_heads": 2,
                "position_score": LearnedRelativeScore(2, embedding_dim=16),
                "use_content_position": True,
                "key_dim": 4,
            },
            r"encoding_dim \(16\) <= key_dim: use position_key_projection=True .*Received: key_dim=4$",
        ),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        layer = RelativeMultiHeadAttention(**kwargs)
        layer.build((None, 4, 4, 3))


@pytest.mark.parametrize(
    "shape, message",
    [
        ((2, 16, 3), "4-D input"),
        ((None, None, 4, 3), "must be known"),
        ((None, 4, None, 3), "must be known"),
    ],
)
def test_bad_input_shapes_are_rejected(shape, message):
    with pytest.raises(ValueError, match=message):
        RelativeMultiHeadAttention(num_heads=2).build(shape)


def test_input_with_other_channels_than_built_is_named():
    layer = RelativeMultiHeadAttention(num_heads=2)
    layer(np.ones((1, 4, 4, 8), "float32"))
    with pytest.raises(ValueError, match=r"expected axis -1 of input shape to have value 8.*\(1, 4, 4, 4\)"):
        layer(np.ones((1, 4, 4, 4), "float32"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"position_score": "quadratic"},
        {"position_score": "quadratic", "separable": False},
        {"position_score": "learned", "use_content_content": True, "use_content_position": True, "key_dim": 4},
    ],
    ids=["separable", "general", "content"],
)
@pytest.mark.parametrize("dtype", ["uint8", "int32"])
def test_integer_inputs_are_values_not_zeros(kwargs, dtype):
    # Pixel values 0..255 in uint8 must attend like the same values in float32 (not like zeros).
    x = np.random.default_rng(4).integers(0, 256, size=(2, 4, 4, 3))
    layer = RelativeMultiHeadAttention(num_heads=2, **kwargs)
    layer.build(x.shape)
    randomize_weights(layer, scale=0.05)
    expected = ops.convert_to_numpy(layer(x.astype("float32")))
    outputs = layer(x.astype(dtype))
    assert dtype_of(outputs) == "float32"
    np.testing.assert_allclose(ops.convert_to_numpy(outputs), expected, rtol=1e-5, atol=1e-4)
    assert np.abs(expected).max() > 1.0


@pytest.mark.parametrize("grid", [(3, 4), (4, 3), (1, 5)], ids=lambda g: f"{g[0]}x{g[1]}")
@pytest.mark.parametrize("projection", [False, True])
@pytest.mark.parametrize("use_bias", [True, False])
def test_the_folded_content_position_term_equals_eq8_and_the_unfolded_term(monkeypatch, grid, projection, use_bias):
    # Accelerators fold the learned encoding's content-position term into the query projection
    # (`path_rule.folds_content_position`); forced here on the CPU, it gives eq. (8), and the values
    # and gradients of the term computed from the queries.
    x = np.random.default_rng(6).normal(size=(2, *grid, 6)).astype("float32")

    def layer():
        return RelativeMultiHeadAttention(
            num_heads=3,
            position_score=LearnedRelativeScore(3, embedding_dim=4, max_position=6, head_vectors=False),
            key_dim=5,
            use_content_content=True,
            use_content_position=True,
            use_position_bias=False,
            position_key_projection=projection,
            use_bias=use_bias,
        )

    def fold(on):
        monkeypatch.setattr(relative_attention, "folds_content_position", lambda: on)

    folded = assert_path_keeps_values_and_gradients(layer, fold, x, seed=7)
    expected, expected_probs = eq8_reference(folded, x)
    outputs, probs = folded(x, return_attention_scores=True)
    np.testing.assert_allclose(ops.convert_to_numpy(probs), expected_probs, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(outputs), expected, atol=1e-5)
