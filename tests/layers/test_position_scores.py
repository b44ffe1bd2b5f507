"""Specifications of the position score functions (eq. 9, Lemma 2, Appendix E, learned)."""

import functools
import json
import zipfile

import keras
import numpy as np
import pytest
from keras import ops
from support import dtype_of

from keras_attnconv.layers import (
    POSITION_SCORES,
    DiagonalGaussianScore,
    GaussianScore,
    LearnedRelativeScore,
    QuadraticScore,
    RelativeMultiHeadAttention,
    SirenScore,
    get_position_score,
    register_position_score,
)
from keras_attnconv.layers.neighbourhood import get_neighbourhood


def softmax(x):
    x = ops.convert_to_numpy(x).astype("float64")  # (a PyTorch tensor that requires grad has no __array__)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def pixel_shifts(height, width):
    """delta[q, k] = k - q as (row, col) for row-major pixel indices: (HW, HW, 2)."""
    rows, cols = np.divmod(np.arange(height * width), width)
    coords = np.stack([rows, cols], axis=-1)
    return coords[None, :, :] - coords[:, None, :]


def built_score(layer, height, width):
    layer.build((None, height, width, 1))
    return layer


def test_quadratic_scores_give_the_softmax_of_minus_alpha_squared_distance():
    height, width, heads = 5, 6, 4
    layer = built_score(QuadraticScore(heads), height, width)
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 2, (heads, 2)).astype("float32")
    alpha = rng.uniform(0.1, 3.0, heads).astype("float32")
    layer.set_weights([centers, alpha])

    delta = pixel_shifts(height, width)
    direct = -alpha[:, None, None] * np.sum((delta[None] - centers[:, None, None, :]) ** 2, axis=-1)
    eq9 = np.einsum(
        "hd,qkd->hqk",
        ops.convert_to_numpy(layer.head_vectors_v()),
        ops.convert_to_numpy(layer.relative_encoding(height, width)),
    )
    ours = ops.convert_to_numpy(layer.position_scores(height, width))

    np.testing.assert_allclose(softmax(ours), softmax(direct), atol=1e-6)
    np.testing.assert_allclose(softmax(eq9), softmax(direct), atol=1e-5)


def lemma_layer(height, width, alpha, centers):
    layer = built_score(QuadraticScore(len(centers)), height, width)
    layer.set_weights([np.asarray(centers, "float32"), np.full(len(centers), alpha, "float32")])
    return layer


@pytest.mark.parametrize("alpha", [46.0, 1000.0])
def test_lemma2_hard_attention_on_the_target_pixel(alpha):
    height, width = 6, 7
    centers = [(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)]  # the 3x3 kernel grid
    probs = softmax(lemma_layer(height, width, alpha, centers).position_scores(height, width))
    checked = 0
    for h, (di, dj) in enumerate(centers):
        for qi in range(height):
            for qj in range(width):
                ki, kj = qi + di, qj + dj
                if 0 <= ki < height and 0 <= kj < width:
                    assert probs[h, qi * width + qj, ki * width + kj] >= 1 - 1e-6
                    checked += 1
    assert checked > 0


def test_lemma2_fails_for_small_alpha():
    # The property above is not vacuous: with alpha = 1 attention is spread out.
    probs = softmax(lemma_layer(6, 7, 1.0, [(0, 0)]).position_scores(6, 7))
    assert probs[0, 0, 0] < 0.9


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_huge_alpha_and_far_centers_stay_finite(policy):
    keras.mixed_precision.set_dtype_policy(policy)
    layer = RelativeMultiHeadAttention(num_heads=3, position_score="quadratic")
    x = np.random.default_rng(0).normal(size=(2, 5, 5, 4)).astype("float32")
    layer.build(x.shape)
    layer.position_score.set_weights([np.array([[0, 0], [40, -40], [1e3, 2e3]], "float32"), np.full(3, 1e4, "float32")])
    outputs, probs = layer(x, return_attention_scores=True)
    assert dtype_of(probs) == "float32"
    assert np.isfinite(ops.convert_to_numpy(ops.cast(outputs, "float32"))).all()
    assert np.isfinite(ops.convert_to_numpy(probs)).all()
    np.testing.assert_allclose(ops.convert_to_numpy(probs).sum(-1), 1.0, atol=1e-5)


# Each with its heads' weights: a head near the grid, one far outside it with huge weights (scores of ~-1e10), one
# centered between pixels on both axes (two nearest keys).
CENTERS = np.array([[0.3, -1.2], [-1e3, 2e3], [0.5, 2.5]], "float32")
PEAKED_SCORES = {
    "quadratic": lambda layer: layer.set_alpha([0.7, 1e4, 2.0]),
    "quadratic, spread width": lambda layer: layer.set_alpha([0.7, 1e4, 2.0]),
    "diagonal gaussian": lambda layer: layer.inverse_sqrt_variances.assign([[1.0, 0.5], [140.0, 140.0], [2.0, 2.0]]),
}
MAKE_PEAKED = {
    "quadratic": lambda: QuadraticScore(3),
    "quadratic, spread width": lambda: QuadraticScore(3, width="spread"),
    "diagonal gaussian": lambda: DiagonalGaussianScore(3),
}


def peaked_score(name, height, width):
    layer = built_score(MAKE_PEAKED[name](), height, width)
    layer.centers.assign(CENTERS)
    PEAKED_SCORES[name](layer)
    return layer


def assert_peaked_rows(peaked, plain):
    """Each row of `peaked` is the same row of `plain` less its maximum, which is an exact 0."""
    plain = plain.astype("float64")
    assert (peaked.max(-1) == 0).all()  # exactly, at the key nearest each query's center
    expected = plain - plain.max(-1, keepdims=True)
    # Within float32's rounding of the plain scores (~1e10 for the far head), which the peaked ones avoid.
    scale = np.abs(plain).max(-1, keepdims=True)
    assert (np.abs(peaked - expected) <= 1e-6 * np.abs(expected) + 2.5e-7 * scale).all()


@pytest.mark.parametrize("name", PEAKED_SCORES)
def test_peaked_scores_are_the_scores_less_each_querys_maximum_which_is_an_exact_zero(name):
    height, width = 5, 6
    layer = peaked_score(name, height, width)
    for peaked, plain in zip(layer.peaked_axis_scores(height, width), layer.axis_scores(height, width)):
        assert_peaked_rows(ops.convert_to_numpy(peaked), ops.convert_to_numpy(plain))
    combined = ops.convert_to_numpy(layer.peaked_position_scores(height, width))
    assert (combined.max(-1) == 0).all()
    np.testing.assert_allclose(softmax(combined), softmax(layer.position_scores(height, width)), atol=1e-6)


@pytest.mark.parametrize("name", PEAKED_SCORES)
def test_peaked_scores_in_windows_peak_at_an_exact_zero_in_each_querys_window(name):
    """With each axis' window keys, the maximum over every query's window is the exact 0, wherever the center."""
    height, width = 6, 7
    layer = peaked_score(name, height, width)
    window_keys = get_neighbourhood(height, width, (3, 5), (2, 1)).axis_window_keys()
    peaked_axes = layer.peaked_axis_scores(height, width, window_keys)
    for peaked, plain, keys in zip(peaked_axes, layer.axis_scores(height, width), window_keys):
        in_window = functools.partial(np.take_along_axis, indices=np.broadcast_to(keys, (3, *keys.shape)), axis=-1)
        assert_peaked_rows(in_window(ops.convert_to_numpy(peaked)), in_window(ops.convert_to_numpy(plain)))


def test_scores_without_a_closed_form_peak_are_left_as_they_are():
    layer = built_score(LearnedRelativeScore(2, embedding_dim=4, max_position=4), 4, 4)
    for peaked, plain in zip(layer.peaked_axis_scores(4, 4), layer.axis_scores(4, 4)):
        np.testing.assert_array_equal(ops.convert_to_numpy(peaked), ops.convert_to_numpy(plain))
    np.testing.assert_array_equal(
        ops.convert_to_numpy(layer.peaked_position_scores(4, 4)), ops.convert_to_numpy(layer.position_scores(4, 4))
    )


def test_gaussian_with_isotropic_covariance_equals_quadratic():
    height, width, heads = 5, 4, 3
    rng = np.random.default_rng(1)
    centers = rng.normal(0, 2, (heads, 2)).astype("float32")
    alpha = rng.uniform(0.2, 2.0, heads).astype("float32")
    quadratic = built_score(QuadraticScore(heads), height, width)
    quadratic.set_weights([centers, alpha])
    gaussian = built_score(GaussianScore(heads), height, width)
    # Sigma = I / (2 alpha)  <=>  Sigma^{-1/2} = sqrt(2 alpha) I
    gaussian.set_weights([centers, np.sqrt(2 * alpha)[:, None, None] * np.eye(2, dtype="float32")])
    np.testing.assert_allclose(
        ops.convert_to_numpy(gaussian.position_scores(height, width)),
        ops.convert_to_numpy(quadratic.position_scores(height, width)),
        rtol=1e-5,
        atol=1e-4,
    )
    np.testing.assert_allclose(gaussian.covariances, quadratic.covariances, rtol=1e-5)


def test_gaussian_scores_match_appendix_e_vector_form():
    height, width, heads = 4, 5, 2
    layer = built_score(GaussianScore(heads), height, width)
    rng = np.random.default_rng(2)
    centers = rng.normal(0, 1.5, (heads, 2))
    sqrt = np.eye(2) + rng.normal(0, 0.4, (heads, 2, 2))
    layer.set_weights([centers.astype("float32"), sqrt.astype("float32")])

    inverse = np.einsum("hij,hkj->hik", sqrt, sqrt)
    mu = np.einsum("hij,hj->hi", inverse, centers)
    # v = 1/2 (2 (S^-1 D)_1, 2 (S^-1 D)_2, -S^-1_11, -S^-1_22, -2 S^-1_12)
    v = 0.5 * np.stack([2 * mu[:, 0], 2 * mu[:, 1], -inverse[:, 0, 0], -inverse[:, 1, 1], -2 * inverse[:, 0, 1]], -1)
    r = ops.convert_to_numpy(layer.relative_encoding(height, width))
    expected = np.einsum("hd,qkd->hqk", v, r)
    np.testing.assert_allclose(softmax(layer.position_scores(height, width)), softmax(expected), atol=1e-5)
    np.testing.assert_allclose(layer.covariances, np.linalg.inv(inverse), rtol=1e-4)


def test_gaussian_initialisation_is_noisy_identity():
    layer = built_score(GaussianScore(64, sigma_init_stddev=0.01), 4, 4)
    sqrt = ops.convert_to_numpy(layer.inverse_sqrt_covariance)
    assert np.abs(sqrt - np.eye(2)).max() < 0.06
    assert 0.005 < np.std(sqrt - np.eye(2)) < 0.015
    assert 1.1 < np.std(ops.convert_to_numpy(layer.centers)) < 1.7  # N(0, 2I)


def test_diagonal_gaussian_equals_the_full_gaussian_with_a_diagonal_inverse_sqrt_covariance():
    height, width, heads = 4, 5, 3
    rng = np.random.default_rng(6)
    centers = rng.normal(0, 1.5, (heads, 2)).astype("float32")
    scales = rng.uniform(0.3, 2.0, (heads, 2)).astype("float32")
    diagonal = built_score(DiagonalGaussianScore(heads), height, width)
    diagonal.set_weights([centers, scales])
    full = built_score(GaussianScore(heads), height, width)
    full.set_weights([centers, scales[:, :, None] * np.eye(2, dtype="float32")])
    np.testing.assert_allclose(
        ops.convert_to_numpy(diagonal.position_scores(height, width)),
        ops.convert_to_numpy(full.position_scores(height, width)),
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_allclose(diagonal.covariances, full.covariances, rtol=1e-5)
    assert diagonal.separable and not full.separable


def rewrite_keras_config(path, rewrite):
    """Rewrites the config.json of a `.keras` file with ``rewrite(dict)``, keeping its weights."""
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    entries["config.json"] = json.dumps(rewrite(json.loads(entries["config.json"])))
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


def test_keras_files_of_the_diagonal_gaussian_score_saved_before_its_class_still_load(tmp_path):
    # Before DiagonalGaussianScore, the axis-aligned score was GaussianScore(diagonal=True), in position_scores.py.
    inputs = keras.Input((4, 5, 3))
    attention = RelativeMultiHeadAttention(2, position_score=DiagonalGaussianScore(2, dtype="float32"))
    model = keras.Model(inputs, attention(inputs))
    model.get_layer(attention.name).position_score.set_weights(
        [np.array([[1.0, -2.0], [0.5, 0.0]], "float32"), np.array([[0.6, 1.7], [1.2, 0.4]], "float32")]
    )

    def as_saved_before(config):
        score = config["config"]["layers"][1]["config"]["position_score"]
        assert score["class_name"] == "DiagonalGaussianScore"
        score.update(
            class_name="GaussianScore",
            registered_name="keras_attnconv>GaussianScore",
            module="keras_attnconv.layers.position_scores",
        )
        score["config"]["diagonal"] = True
        return config

    path = tmp_path / "old.keras"
    model.save(path)
    rewrite_keras_config(path, as_saved_before)
    restored = keras.saving.load_model(path, safe_mode=True)
    x = np.random.default_rng(0).normal(size=(2, 4, 5, 3)).astype("float32")
    assert isinstance(restored.layers[1].position_score, DiagonalGaussianScore)
    np.testing.assert_array_equal(ops.convert_to_numpy(restored(x)), ops.convert_to_numpy(model(x)))


def test_names_build_the_diagonal_gaussian_and_give_the_learned_encoding_the_key_dim():
    assert isinstance(get_position_score("gaussian", 2, diagonal=True), DiagonalGaussianScore)
    assert type(get_position_score("gaussian", 2)) is GaussianScore
    assert get_position_score("learned", 2, key_dim=6).embedding_dim == 6
    assert get_position_score("learned", 2, key_dim=6, embedding_dim=4).embedding_dim == 4
    attention = RelativeMultiHeadAttention(2, position_score="learned", key_dim=10)
    attention.build((None, 3, 3, 4))
    assert attention.position_score.embedding_dim == 10


def test_learned_scores_depend_only_on_the_shift():
    height, width = 4, 5
    layer = built_score(LearnedRelativeScore(3, embedding_dim=8), height, width)
    rng = np.random.default_rng(3)
    layer.set_weights([rng.normal(size=w.shape).astype("float32") for w in layer.get_weights()])
    scores = ops.convert_to_numpy(layer.position_scores(height, width))
    delta = pixel_shifts(height, width)
    for shift in {tuple(d) for d in delta.reshape(-1, 2)}:
        mask = np.all(delta == shift, axis=-1)
        values = scores[:, mask]  # (heads, pairs with this shift)
        np.testing.assert_allclose(values, values[:, :1].repeat(values.shape[1], 1), atol=1e-6)
    # ... and on the shift in both axes: different shifts give different scores.
    assert np.unique(np.round(scores[0], 5)).size == (2 * height - 1) * (2 * width - 1)


def test_learned_factorised_content_position_equals_full_encoding():
    height, width, heads = 3, 4, 2
    layer = built_score(LearnedRelativeScore(heads, embedding_dim=6, max_position=5), height, width)
    rng = np.random.default_rng(4)
    layer.set_weights([rng.normal(size=w.shape).astype("float32") for w in layer.get_weights()])
    queries = rng.normal(size=(2, height * width, heads, 6)).astype("float32")
    full = np.einsum("bqhd,qkd->bhqk", queries, ops.convert_to_numpy(layer.relative_encoding(height, width)))
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.content_position_scores(queries, height, width)), full, atol=1e-5
    )


def attention_moments(score, height, width):
    """Mean and covariance, over shifts, of each head's attention for the query closest to the grid center.

    Computed from the position scores alone, so it applies to any encoding.

    Returns:
        (means, covariances): (heads, 2) and (heads, 2, 2) in (row shift, column shift) coordinates.
    """
    query = (height // 2) * width + width // 2
    probs = softmax(ops.convert_to_numpy(score.position_scores(height, width))[:, query, :])
    rows, cols = np.divmod(np.arange(height * width), width)
    shifts = np.stack([rows - height // 2, cols - width // 2], axis=-1).astype("float64")
    means = probs @ shifts
    centered = shifts[None, :, :] - means[:, None, :]
    return means, np.einsum("hk,hki,hkj->hij", probs, centered, centered)


def test_attention_moments_recover_quadratic_centers_and_covariances():
    height = width = 31
    layer = built_score(QuadraticScore(2), height, width)
    centers = np.array([[1.3, -2.7], [-0.4, 0.8]], "float32")
    layer.set_weights([centers, np.array([0.1, 0.25], "float32")])
    means, covariances = attention_moments(layer, height, width)
    np.testing.assert_allclose(means, centers, atol=1e-3)
    np.testing.assert_allclose(covariances, layer.covariances, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("num_heads", [0, -2, 2.5, True])
def test_bad_num_heads_is_named(num_heads):
    with pytest.raises(ValueError, match=f"num_heads={num_heads!r}"):
        QuadraticScore(num_heads)


def test_unknown_score_name_suggests_the_closest():
    with pytest.raises(ValueError, match="Did you mean 'quadratic'.*position_score='quadratc'"):
        get_position_score("quadratc", num_heads=2)


@pytest.mark.parametrize("shape, message", [((4, 4, 3), "4-D input"), ((None, None, 4, 3), "must be known")])
def test_bad_grid_shapes_are_rejected(shape, message):
    with pytest.raises(ValueError, match=message):
        QuadraticScore(2).build(shape)


def test_learned_rejects_grids_beyond_max_position():
    with pytest.raises(ValueError, match="max_position"):
        LearnedRelativeScore(2, embedding_dim=4, max_position=4).build((None, 5, 5, 1))
    with pytest.raises(ValueError, match="embedding_dim=1"):
        LearnedRelativeScore(2, embedding_dim=1)


def randomized_siren(height, width, **kwargs):
    layer = built_score(SirenScore(3, hidden_units=16, **kwargs), height, width)
    rng = np.random.default_rng(5)
    layer.set_weights([rng.uniform(-0.3, 0.3, w.shape).astype("float32") for w in layer.get_weights()])
    return layer


def test_siren_scores_depend_only_on_the_normalised_shift():
    small = randomized_siren(5, 5)
    large = built_score(SirenScore(3, hidden_units=16), 9, 9)
    large.set_weights(small.get_weights())  # same weights serve any grid size
    small_scores = ops.convert_to_numpy(small.position_scores(5, 5))
    large_scores = ops.convert_to_numpy(large.position_scores(9, 9))
    # shift (2, -1) on the 5x5 grid and (4, -2) on the 9x9 grid are both (0.5, -0.25) once normalised
    np.testing.assert_allclose(small_scores[:, 0 * 5 + 1, 2 * 5 + 0], large_scores[:, 0 * 9 + 2, 4 * 9 + 0], atol=1e-5)
    delta = pixel_shifts(5, 5)
    for shift in {tuple(d) for d in delta.reshape(-1, 2)}:
        values = small_scores[:, np.all(delta == shift, axis=-1)]
        np.testing.assert_allclose(values, values[:, :1].repeat(values.shape[1], 1), atol=1e-6)


def test_siren_initialisation_follows_the_siren_paper():
    omega, width = 30.0, 256
    layer = built_score(SirenScore(64, hidden_units=width, num_hidden_layers=2, omega_0=omega), 4, 4)
    first = ops.convert_to_numpy(layer.sine_kernels[0])
    hidden = ops.convert_to_numpy(layer.sine_kernels[1])
    head = ops.convert_to_numpy(layer.head_kernel)
    assert np.abs(first).max() <= 0.5 and np.std(first) == pytest.approx(0.5 / np.sqrt(3), rel=0.1)
    limit = np.sqrt(6 / width) / omega
    for kernel in (hidden, head):
        assert np.abs(kernel).max() <= limit
        assert np.std(kernel) == pytest.approx(limit / np.sqrt(3), rel=0.05)
    # With this initialisation the pre-activations of hidden layers stay ~N(0, 1)-like: sin keeps ~unit spread.
    features = ops.convert_to_numpy(layer.shift_features(4, 4))
    assert 0.4 < features.std() < 0.9


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"omega_0": 0.0}, "omega_0=0.0"),
        ({"omega_0": -30.0}, "omega_0=-30.0"),
        ({"hidden_units": 0}, "hidden_units=0"),
        ({"num_hidden_layers": 0}, "num_hidden_layers=0"),
    ],
)
def test_siren_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SirenScore(2, **kwargs)


@pytest.mark.parametrize(
    "name, score_class, message",
    [
        ("quadratic", SirenScore, "registered as 'quadratic' already \\(QuadraticScore\\)"),
        ("_private", SirenScore, "starting with a letter. Received: name='_private'"),
        ("Manhattan", SirenScore, "Received: name='Manhattan'"),
        ("../x", SirenScore, "Received: name='../x'"),
        ("manhattan", RelativeMultiHeadAttention, "a PositionScore subclass. Received: score_class="),
    ],
)
def test_register_position_score_refuses_a_taken_or_bad_name_and_what_is_not_a_score(name, score_class, message):
    with pytest.raises(ValueError, match=message):
        register_position_score(name, score_class)
    assert POSITION_SCORES["quadratic"] is QuadraticScore and "manhattan" not in POSITION_SCORES
