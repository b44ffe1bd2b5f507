"""The separable fast path for position-only heads equals the general eq. (8) path."""

import keras
import numpy as np
import pytest
from conftest import randomize_weights
from keras import ops

from keras_attnconv import build_model
from keras_attnconv.layers import GaussianScore, RelativeMultiHeadAttention


def value_and_gradients(layer, x):
    """Output and gradients of sum(output * fixed weights) w.r.t. the input and every weight."""
    backend = keras.backend.backend()
    probe = np.random.default_rng(9).normal(size=layer.compute_output_shape(x.shape)).astype("float32")
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * probe)
        grads = tape.gradient(loss, [x, *layer.trainable_variables])
        return y, [g for g in grads]
    if backend == "jax":
        import jax

        variables = [v.value for v in layer.trainable_variables]

        def loss(inputs, values):
            y, _ = layer.stateless_call(values, [v.value for v in layer.non_trainable_variables], inputs)
            return (y.astype("float32") * probe).sum(), y

        (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, variables)
        return y, [grads[0], *grads[1]]
    pytest.skip(f"no gradient helper for backend {backend}")


def fast_and_general(score, shape, heads=4, output_dim=None, seed=0, centers=None, alpha=None):
    x = np.random.default_rng(seed).normal(size=shape).astype("float32")
    pair = [RelativeMultiHeadAttention(heads, position_score=score() if callable(score) else score,
                                       separable=separable, output_dim=output_dim) for separable in (True, False)]
    for layer in pair:
        layer.build(x.shape)
    randomize_weights(pair[0], seed=seed)
    if centers is not None:
        pair[0].position_score.centers.assign(centers)
        pair[0].position_score.alpha.assign(alpha)
    pair[1].set_weights(pair[0].get_weights())
    return pair, x


@pytest.mark.parametrize("shape", [(2, 5, 7, 6), (2, 4, 4, 6), (1, 8, 3, 5), (2, 6, 6, 3)])
@pytest.mark.parametrize("score", ["quadratic", "learned", lambda: GaussianScore(4, diagonal=True)],
                         ids=["quadratic", "learned", "gaussian_diagonal"])
def test_fast_path_equals_general_path_in_values_and_gradients(score, shape):
    (fast, general), x = fast_and_general(score, shape, output_dim=shape[-1] - 1)
    assert (fast.attention_mode, general.attention_mode) == ("separable", "position")
    fast_y, fast_grads = value_and_gradients(fast, x)
    general_y, general_grads = value_and_gradients(general, x)
    np.testing.assert_allclose(ops.convert_to_numpy(fast_y), ops.convert_to_numpy(general_y), atol=1e-5)
    for a, b in zip(fast_grads, general_grads):
        np.testing.assert_allclose(ops.convert_to_numpy(a), ops.convert_to_numpy(b), rtol=1e-5, atol=1e-5)


def centre_gradients_float64(layer, x):
    """d(sum(output * probe))/d(centres, alpha) of a quadratic layer, in float64 NumPy."""
    height, width = x.shape[1:3]
    probe = np.random.default_rng(9).normal(size=layer.compute_output_shape(x.shape)).astype("float64")
    centers = ops.convert_to_numpy(layer.position_score.centers).astype("float64")
    alpha = ops.convert_to_numpy(layer.position_score.alpha).astype("float64")
    kernel = ops.convert_to_numpy(layer.output_kernel).astype("float64")
    rows, cols = np.divmod(np.arange(height * width), width)
    d1 = (rows[None, :] - rows[:, None])[None] - centers[:, 0, None, None]
    d2 = (cols[None, :] - cols[:, None])[None] - centers[:, 1, None, None]
    scores = -alpha[:, None, None] * (d1**2 + d2**2)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    tokens = x.reshape(x.shape[0], height * width, -1).astype("float64")
    values = np.einsum("bkc,hco->bkho", tokens, kernel)
    upstream = np.einsum("bqo,bkho->hqk", probe.reshape(x.shape[0], height * width, -1), values)
    d_scores = probs * (upstream - (probs * upstream).sum(-1, keepdims=True))
    d_centers = np.stack([(d_scores * 2 * alpha[:, None, None] * d1).sum((1, 2)),
                          (d_scores * 2 * alpha[:, None, None] * d2).sum((1, 2))], -1)
    return d_centers, (d_scores * -(d1**2 + d2**2)).sum((1, 2))


@pytest.mark.parametrize("alpha", [0.05, 46.0, 1e4])
def test_far_centres_and_huge_alpha(alpha):
    centers = np.array([[0.3, -0.7], [40.0, -55.0], [-1e3, 2e3], [2.0, 1.0]], "float32")
    (fast, general), x = fast_and_general("quadratic", (2, 6, 5, 4), centers=centers,
                                          alpha=np.full(4, alpha, "float32"))
    fast_y, fast_grads = value_and_gradients(fast, x)
    general_y, general_grads = value_and_gradients(general, x)
    assert np.isfinite(ops.convert_to_numpy(fast_y)).all()
    np.testing.assert_allclose(ops.convert_to_numpy(fast_y), ops.convert_to_numpy(general_y), atol=1e-5)
    names = ["inputs", *(v.name for v in fast.trainable_variables)]
    fast_by_name, general_by_name = dict(zip(names, fast_grads)), dict(zip(names, general_grads))
    for name in ("inputs", "output_kernel", "output_bias"):
        np.testing.assert_allclose(ops.convert_to_numpy(fast_by_name[name]),
                                   ops.convert_to_numpy(general_by_name[name]), rtol=1e-5, atol=1e-5,
                                   err_msg=name)
    # Centre and alpha gradients: both paths agree with a float64 reference to 1e-5 although the
    # far heads' score slopes reach 2*alpha*|delta - Delta| ~ 200 and |delta - Delta|^2 ~ 5e6.
    # (Compared with the reference rather than with each other: two float32 sums over all
    # (query, key) pairs, each within 1e-5 of the truth, can be 2e-5 apart.)
    reference = centre_gradients_float64(fast, x)
    for name, exact in zip(("centers", "alpha"), reference):
        for path, gradients in (("fast", fast_by_name), ("general", general_by_name)):
            np.testing.assert_allclose(ops.convert_to_numpy(gradients[name]), exact, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{path} {name}")


def test_bfloat16_fast_path_within_its_tolerance():
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    (fast, general), x = fast_and_general("quadratic", (2, 6, 6, 8))
    fast_y, probs = fast(x, return_attention_scores=True)
    assert fast_y.dtype == "bfloat16" and probs.dtype == "float32"
    np.testing.assert_allclose(ops.convert_to_numpy(ops.cast(fast_y, "float32")),
                               ops.convert_to_numpy(ops.cast(general(x), "float32")), atol=0.05, rtol=0.02)


def test_returned_probabilities_are_the_outer_product():
    (fast, general), x = fast_and_general("quadratic", (1, 4, 5, 3))
    _, fast_probs = fast(x, return_attention_scores=True)
    _, general_probs = general(x, return_attention_scores=True)
    np.testing.assert_allclose(ops.convert_to_numpy(fast_probs), ops.convert_to_numpy(general_probs), atol=1e-6)


def test_fast_path_is_used_only_where_it_applies_and_is_cheaper():
    def mode(**kwargs):
        layer = RelativeMultiHeadAttention(2, **kwargs)
        layer.build((None, *kwargs.pop("grid", (6, 6)), 3))
        return layer.attention_mode

    assert mode() == "separable"
    assert mode(position_score="gaussian") == "position"  # full covariance: not separable
    assert mode(use_content_content=True) == "content"
    assert mode(separable=False) == "position"
    with pytest.raises(ValueError, match="not separable.*separable=True"):
        mode(position_score="gaussian", separable=True)


def test_factorised_dropout_keeps_the_expected_output():
    x = np.random.default_rng(0).normal(size=(2, 5, 5, 3)).astype("float32")
    fast = RelativeMultiHeadAttention(4, dropout=0.3)
    fast.build(x.shape)
    randomize_weights(fast)
    assert fast.attention_mode == "separable"
    inference = ops.convert_to_numpy(fast(x))
    samples = np.stack([ops.convert_to_numpy(fast(x, training=True)) for _ in range(400)])
    assert not np.allclose(samples[0], inference)
    # Unbiased: the Monte Carlo mean is within 5 standard errors of the inference output.
    standard_error = samples.std(axis=0) / np.sqrt(len(samples))
    assert np.all(np.abs(samples.mean(axis=0) - inference) <= 5 * standard_error + 1e-6)


@pytest.mark.parametrize("name, expected", [("quadratic_tiny", "separable"), ("learned_tiny", "separable"),
                                            ("gaussian_tiny", "position"), ("learned_content_tiny", "content")])
def test_models_pick_the_fast_path_and_their_outputs_are_unchanged(name, expected):
    model = build_model(name, seed=0, num_layers=1, hidden_dim=8, intermediate_dim=8, image_size=12,
                        position_embedding_dim=8)
    assert model.get_layer("encoder_0").attention.attention_mode == expected
    config = model.get_config()
    for layer in config["layers"]:
        if layer["class_name"] == "TransformerEncoderBlock":
            layer["config"]["attention_options"]["separable"] = False
    reference = keras.Model.from_config(config)
    reference.set_weights(model.get_weights())
    assert reference.get_layer("encoder_0").attention.attention_mode in ("position", "content")
    x = np.random.default_rng(0).normal(size=(2, 12, 12, 3)).astype("float32")
    np.testing.assert_allclose(ops.convert_to_numpy(model(x)), ops.convert_to_numpy(reference(x)), atol=1e-5)


def test_bad_separable_argument_is_named():
    with pytest.raises(ValueError, match="separable='yes'"):
        RelativeMultiHeadAttention(2, separable="yes")
