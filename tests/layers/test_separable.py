"""The separable fast path for position-only heads equals the general eq. (8) path."""

import keras
import numpy as np
import pytest
from keras import ops
from support import dtype_of, randomize_weights, training_calls, value_and_gradients

from keras_attnconv import build_model
from keras_attnconv.layers import RelativeMultiHeadAttention, get_position_score
from keras_attnconv.layers.path_rule import default_platform, folds_content_position, paths_for
from keras_attnconv.models.attention_classifier import with_attention_options


def fast_and_general(score, shape, heads=4, output_dim=None, seed=0, centers=None, alpha=None):
    x = np.random.default_rng(seed).normal(size=shape).astype("float32")
    pair = [
        RelativeMultiHeadAttention(
            heads, position_score=score() if callable(score) else score, separable=separable, output_dim=output_dim
        )
        for separable in (True, False)
    ]
    for layer in pair:
        layer.build(x.shape)
    randomize_weights(pair[0], seed=seed)
    if centers is not None:
        pair[0].position_score.centers.assign(centers)
        pair[0].position_score.alpha.assign(alpha)
    pair[1].set_weights(pair[0].get_weights())
    return pair, x


@pytest.mark.parametrize("shape", [(2, 5, 7, 6), (2, 4, 4, 6), (1, 8, 3, 5), (2, 6, 6, 3)])
@pytest.mark.parametrize(
    "score",
    ["quadratic", "learned", lambda: get_position_score("gaussian", 4, diagonal=True)],
    ids=["quadratic", "learned", "gaussian_diagonal"],
)
def test_fast_path_equals_general_path_in_values_and_gradients(score, shape):
    (fast, general), x = fast_and_general(score, shape, output_dim=shape[-1] - 1)
    assert (fast.attention_mode, general.attention_mode) == ("separable", "position")
    fast_y, fast_grads = value_and_gradients(fast, x)
    general_y, general_grads = value_and_gradients(general, x)
    np.testing.assert_allclose(ops.convert_to_numpy(fast_y), ops.convert_to_numpy(general_y), atol=1e-5)
    for a, b in zip(fast_grads, general_grads):
        np.testing.assert_allclose(ops.convert_to_numpy(a), ops.convert_to_numpy(b), rtol=1e-5, atol=1e-5)


def center_gradients_float64(layer, x):
    """d(sum(output * probe))/d(centers, alpha) of a quadratic layer, in float64 NumPy.

    Returns:
        ``((d_centers, d_alpha), (center_scale, alpha_scale))``: the gradients, and for each entry
        the sum of the absolute values of the (query, key) terms it adds up, which bounds what
        float32's rounding of that sum can be off by (a few units in the last place of it).
    """
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
    center_terms = [d_scores * 2 * alpha[:, None, None] * d for d in (d1, d2)]
    alpha_terms = d_scores * -(d1**2 + d2**2)
    gradients = np.stack([t.sum((1, 2)) for t in center_terms], -1), alpha_terms.sum((1, 2))
    scales = np.stack([np.abs(t).sum((1, 2)) for t in center_terms], -1), np.abs(alpha_terms).sum((1, 2))
    return gradients, scales


# Scores of ~-1e10 (alpha 1e4, a center 1e3 away): XLA may round them otherwise in each kernel it recomputes them in
# (its default code gave +496 for the dominant score minus their maximum; its unoptimised code, which the tests
# compile, gave NaN on both backends until the peak was an exact 0: docs/performance.md).
@pytest.mark.parametrize("alpha", [0.05, 46.0, 1e4])
def test_far_centers_and_huge_alpha(alpha):
    centers = np.array([[0.3, -0.7], [40.0, -55.0], [-1e3, 2e3], [2.0, 1.0]], "float32")
    (fast, general), x = fast_and_general(
        "quadratic", (2, 6, 5, 4), centers=centers, alpha=np.full(4, alpha, "float32")
    )
    fast_y, fast_grads = value_and_gradients(fast, x)
    general_y, general_grads = value_and_gradients(general, x)
    assert np.isfinite(ops.convert_to_numpy(fast_y)).all()
    np.testing.assert_allclose(ops.convert_to_numpy(fast_y), ops.convert_to_numpy(general_y), atol=1e-5)
    names = ["inputs", *(v.name for v in fast.trainable_variables)]
    fast_by_name, general_by_name = dict(zip(names, fast_grads)), dict(zip(names, general_grads))
    for name in ("inputs", "output_kernel", "output_bias"):
        np.testing.assert_allclose(
            ops.convert_to_numpy(fast_by_name[name]),
            ops.convert_to_numpy(general_by_name[name]),
            rtol=1e-5,
            atol=1e-5,
            err_msg=name,
        )
    # Center and alpha gradients: both paths agree with a float64 reference to 1e-5, plus 8 float32
    # units in the last place of the sum of the absolute terms, although the far heads' score slopes
    # reach 2*alpha*|delta - Delta| ~ 200 and |delta - Delta|^2 ~ 5e6: a saturated head's terms are
    # exactly zero (hence its gradients too), while the unsaturated head centered at (40, -55) sums
    # terms of ~|delta - Delta|^2 = 4,600 to 8.6 (alpha 0.05: its XLA reductions have been 1.1e-4
    # off). Compared with the reference rather than with each other: two float32 sums, each within
    # that bound, can be twice as far apart.
    reference, scales = center_gradients_float64(fast, x)
    for name, exact, scale in zip(("centers", "alpha"), reference, scales):
        for path, gradients in (("fast", fast_by_name), ("general", general_by_name)):
            actual = ops.convert_to_numpy(gradients[name])
            tolerance = 1e-5 + 1e-5 * np.abs(exact) + 8 * np.finfo("float32").eps * scale
            assert (np.abs(actual - exact) <= tolerance).all(), f"{path} {name}: {actual} vs {exact} +- {tolerance}"


def test_bfloat16_fast_path_within_its_tolerance():
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    (fast, general), x = fast_and_general("quadratic", (2, 6, 6, 8))
    fast_y, probs = fast(x, return_attention_scores=True)
    assert dtype_of(fast_y) == "bfloat16" and dtype_of(probs) == "float32"
    np.testing.assert_allclose(
        ops.convert_to_numpy(ops.cast(fast_y, "float32")),
        ops.convert_to_numpy(ops.cast(general(x), "float32")),
        atol=0.05,
        rtol=0.02,
    )


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


def dropped_probabilities(layer, x, draws):
    """Attention probabilities (heads, T, T) and `draws` samples of them after dropout (draws, heads, T, T).

    With one-hot pixels and an output kernel that writes head h's context into its own block of
    outputs, the output of the layer is the dropped probability matrix of every head.
    """
    heads, tokens = layer.num_heads, x.shape[-1]
    kernel = np.zeros((heads, tokens, heads * tokens), "float32")
    for head in range(heads):
        kernel[head, :, head * tokens : (head + 1) * tokens] = np.eye(tokens)
    layer.output_kernel.assign(kernel)
    _, probabilities = layer(x, return_attention_scores=True)
    samples = training_calls(layer, x, draws).reshape(draws, tokens, heads, tokens)  # (draw, query, head, key)
    return ops.convert_to_numpy(probabilities)[0], samples.transpose(0, 2, 1, 3)


def test_separable_attention_dropout_keeps_each_link_with_probability_one_minus_dropout_unbiased():
    # Row and column links are dropped at the rate 1 - sqrt(1 - dropout) each; a rate of `dropout` per
    # axis would keep a (query, key) link with probability (1 - dropout)^2 = 0.25 here.
    dropout, draws, height, width = 0.5, 400, 3, 3
    x = np.eye(height * width, dtype="float32").reshape(1, height, width, height * width)
    layer = RelativeMultiHeadAttention(2, output_dim=2 * height * width, dropout=dropout, use_bias=False)
    layer.build(x.shape)
    assert layer.attention_mode == "separable"
    probabilities, samples = dropped_probabilities(layer, x, draws)
    assert probabilities.min() > 1e-6  # every link can be seen kept or dropped
    kept = (samples != 0).mean(axis=0)
    tolerance = 4.5 * np.sqrt(dropout * (1 - dropout) / draws)  # 4.5 standard errors: each of 162 links passes
    np.testing.assert_array_less(np.abs(kept - (1 - dropout)), tolerance)
    # Unbiased: the mean of the dropped probabilities is the probabilities.
    standard_error = samples.std(axis=0) / np.sqrt(draws)
    np.testing.assert_array_less(np.abs(samples.mean(axis=0) - probabilities), 4.5 * standard_error + 1e-7)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("quadratic_tiny", "separable"),
        ("learned_tiny", "separable"),
        ("gaussian_tiny", "position"),
        ("learned_content_tiny", "content"),
    ],
)
def test_models_pick_the_fast_path_and_their_outputs_are_unchanged(name, expected):
    model = build_model(
        name, seed=0, num_layers=1, hidden_dim=8, intermediate_dim=8, image_size=12, position_embedding_dim=8
    )
    assert model.get_layer("encoder_0").attention.attention_mode == expected
    reference = with_attention_options(model, separable=False)
    assert reference.get_layer("encoder_0").attention.attention_mode in ("position", "content")
    x = np.random.default_rng(0).integers(0, 256, (2, 12, 12, 3), dtype=np.uint8)
    np.testing.assert_allclose(ops.convert_to_numpy(model(x)), ops.convert_to_numpy(reference(x)), atol=1e-5)


def test_bad_separable_argument_is_named():
    with pytest.raises(ValueError, match="separable='yes'"):
        RelativeMultiHeadAttention(2, separable="yes")


def test_the_path_rule_is_per_platform():
    # CPU: separable wherever it does fewer FLOPs; accelerators: the dense contraction up to 1024 tokens.
    layer = RelativeMultiHeadAttention(2)
    layer.build((None, 16, 16, 3))
    assert [layer.attention_mode_for(16, 16, platform) for platform in ("cpu", "gpu", "tpu")] == [
        "separable",
        "position",
        "position",
    ]
    assert layer.attention_mode_for(32, 32, "gpu") == "position"
    assert layer.attention_mode_for(33, 32, "gpu") == "separable"
    assert layer.attention_mode_for(1, 2, "cpu") == "position"  # 1 + 2 > 1 * 2: the passes cost more
    assert layer.attention_mode == layer.attention_mode_for(16, 16, default_platform())
    forced = RelativeMultiHeadAttention(2, separable=True)
    forced.build((None, 16, 16, 3))
    assert forced.attention_mode_for(16, 16, "gpu") == "separable"
    with pytest.raises(ValueError, match="platform='cuda'"):
        layer.attention_mode_for(16, 16, "cuda")


def test_accelerators_fold_the_content_position_term_into_the_query_projection_and_a_cpu_does_not():
    assert [folds_content_position(platform) for platform in ("cpu", "gpu", "tpu")] == [False, True, True]
    with pytest.raises(ValueError, match="platform='cuda'"):
        folds_content_position("cuda")


def test_inside_paths_for_layers_take_another_platform_s_paths_and_outside_their_machine_s():
    def built():
        layer = RelativeMultiHeadAttention(2)
        layer.build((None, 16, 16, 3))
        return layer

    here = default_platform()
    with paths_for("gpu"):
        assert built().attention_mode == "position" and folds_content_position()
        with paths_for("cpu"):
            assert built().attention_mode == "separable" and not folds_content_position()
        assert folds_content_position()
    assert built().attention_mode == built().attention_mode_for(16, 16, here)
    assert folds_content_position() == (here != "cpu")
    with pytest.raises(ValueError, match="platform='cuda'"):
        with paths_for("cuda"):
            pass
