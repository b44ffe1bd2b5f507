"""Specifications of the Table 2 optimisation: warm-up + cosine schedule, coupled L2 weight decay."""

import math

import keras
import numpy as np
import pytest
from keras import ops
from support import dtype_of

import keras_attnconv
from keras_attnconv.optim import CoupledWeightDecaySGD, LabelSmoothingCrossentropy, WarmupCosineDecay
from keras_attnconv.training.recipe import RECIPES_DIR


def lr(schedule, step):
    return float(ops.convert_to_numpy(schedule(step)))


def test_schedule_warms_up_linearly_then_decays_to_zero():
    schedule = WarmupCosineDecay(0.1, total_steps=1000, warmup_steps=50)
    assert lr(schedule, 0) == 0.0
    assert lr(schedule, 25) == pytest.approx(0.05)
    assert lr(schedule, 50) == pytest.approx(0.1)  # end of warm-up: the peak
    assert lr(schedule, 525) == pytest.approx(0.05, rel=1e-5)  # half-way through the cosine
    assert lr(schedule, 1000) == pytest.approx(0.0, abs=1e-9)  # last step
    assert lr(schedule, 2000) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(
    "steps_per_epoch, warmup_steps, first",
    [(None, 0, 0), (None, 5, 1), (4, 0, 0), (4, 5, 4), (4, 2, 4)],  # per step; held per epoch of 4 steps
)
def test_the_first_nonzero_step_is_the_first_whose_rate_is_above_zero(steps_per_epoch, warmup_steps, first):
    schedule = WarmupCosineDecay(0.1, total_steps=40, warmup_steps=warmup_steps, steps_per_epoch=steps_per_epoch)
    assert schedule.first_nonzero_step == first
    assert [lr(schedule, step) for step in range(first)] == [0.0] * first and lr(schedule, first) > 0


def test_schedule_serializes():
    schedule = WarmupCosineDecay(0.1, total_steps=100, warmup_steps=5)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert clone.get_config() == schedule.get_config()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"peak_learning_rate": 0.0, "total_steps": 10}, "peak_learning_rate=0.0"),
        ({"peak_learning_rate": 0.1, "total_steps": 0}, "total_steps=0"),
        ({"peak_learning_rate": 0.1, "total_steps": 10, "warmup_steps": 10}, "warmup_steps=10"),
    ],
)
def test_schedule_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WarmupCosineDecay(**kwargs)


def test_weight_decay_is_l2_added_to_the_gradient_before_momentum():
    # Hand-computed torch.optim.SGD(lr, momentum=0.9, weight_decay=0.1) with a changing learning rate.
    schedule = WarmupCosineDecay(0.5, total_steps=4, warmup_steps=2)
    optimizer = CoupledWeightDecaySGD(schedule, momentum=0.9, weight_decay=0.1)
    w0 = np.array([1.0, -2.0, 3.0], "float32")
    variable = keras.Variable(w0)
    gradients = [
        np.array([0.5, 0.5, -1.0], "float32"),
        np.array([-0.2, 0.1, 0.3], "float32"),
        np.array([0.05, -0.4, 0.2], "float32"),
    ]
    w, buffer = w0.astype("float64"), np.zeros(3)
    for step, gradient in enumerate(gradients):
        optimizer.apply_gradients([(ops.convert_to_tensor(gradient), variable)])
        learning_rate = 0.5 * step / 2 if step < 2 else 0.5 * 0.5 * (1 + math.cos(math.pi * (step - 2) / 2))
        buffer = 0.9 * buffer + (gradient + 0.1 * w)
        w = w - learning_rate * buffer
    np.testing.assert_allclose(ops.convert_to_numpy(variable), w, rtol=1e-6)


def test_optimizer_serializes_and_rejects_bad_values():
    optimizer = CoupledWeightDecaySGD(0.1, momentum=0.8, weight_decay=5e-4)
    clone = CoupledWeightDecaySGD.from_config(optimizer.get_config())
    assert (clone.momentum, clone.l2_weight_decay) == (0.8, 5e-4)
    with pytest.raises(ValueError, match="momentum=1.0"):
        CoupledWeightDecaySGD(momentum=1.0)
    with pytest.raises(ValueError, match="weight_decay=-1"):
        CoupledWeightDecaySGD(weight_decay=-1)


RECIPES = RECIPES_DIR


def diagonal_gaussian_heads():
    from keras_attnconv.layers import DiagonalGaussianScore

    layer = DiagonalGaussianScore(num_heads=2)
    layer.build((1, 4, 4, 8))
    return layer.trainable_weights


def model_weights(name, **overrides):
    def weights():
        return keras_attnconv.build_model(name, **overrides).trainable_weights

    return weights


#: What the official code spares from weight decay, per kind of weight, written out here rather than taken from the
#: package: (an official recipe, the weights of a model or layer holding that kind, the names spared there).
SPARED = {
    "quadratic centers and spreads": (
        "quadratic",
        model_weights("quadratic_tiny", quadratic_width="spread"),
        {"centers", "spreads"},
    ),
    "quadratic centers and alphas": (
        "quadratic",
        model_weights("quadratic_tiny", quadratic_width="alpha"),
        {"centers", "alpha"},
    ),
    "gaussian centers and covariances": (
        "gaussian",
        model_weights("gaussian_tiny"),
        {"centers", "inverse_sqrt_covariance"},
    ),
    "diagonal gaussian centers and variances": (
        "gaussian",
        diagonal_gaussian_heads,
        {"centers", "inverse_sqrt_variances"},
    ),
    "span centers and widths": ("learned", model_weights("learned_span_tiny"), {"span_center", "span_raw_sigma"}),
    "quadratic heads with a span": (
        "quadratic",
        model_weights("quadratic_span_tiny"),
        {"centers", "alpha", "span_center", "span_raw_sigma"},
    ),
    "learned encodings: none": ("learned", model_weights("learned_tiny"), set()),
    "learned encodings with content: none": (
        "learned_content_official",
        model_weights("learned_content_official_tiny"),
        set(),
    ),
    "siren encodings: none": ("quadratic", model_weights("siren_tiny"), set()),
    "resnet: none": ("resnet18", model_weights("resnet_tiny"), set()),
}


@pytest.mark.parametrize("kind", SPARED)
def test_the_official_recipes_spare_exactly_the_centers_and_spreads_from_weight_decay(kind):
    from keras_attnconv.training.fit import run_optimizer
    from keras_attnconv.training.recipe import load_recipe

    recipe, weights_of, spared_names = SPARED[kind]
    config = load_recipe(RECIPES / f"{recipe}.toml")
    assert not config.decay_centers_and_spreads  # an official recipe
    weights = weights_of()
    for weight in weights:  # nonzero everywhere: a decayed weight moves
        weight.assign(np.ones(weight.shape, weight.dtype))
    optimizer = run_optimizer(config, 0.1)
    optimizer.apply_gradients([(np.zeros(w.shape, "float32"), w) for w in weights])  # only the decay moves them
    spared = [w for w in weights if np.array_equal(ops.convert_to_numpy(w), np.ones(w.shape))]
    assert {w.name for w in weights} >= spared_names  # the kind is there
    assert sorted(w.path for w in spared) == sorted(w.path for w in weights if w.name in spared_names)


def _losses_of(loss, labels, predictions):
    return ops.convert_to_numpy(loss(labels, predictions))


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("from_logits", [True, False])
def test_label_smoothing_crossentropy_is_keras_categorical_crossentropy_of_one_hot_labels(label_smoothing, from_logits):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, size=8)
    logits = rng.normal(scale=3.0, size=(8, 10)).astype("float32")
    predictions = logits if from_logits else ops.convert_to_numpy(ops.softmax(logits))
    reference = keras.losses.CategoricalCrossentropy(from_logits=from_logits, label_smoothing=label_smoothing)
    ours = LabelSmoothingCrossentropy(label_smoothing, from_logits=from_logits)
    expected = _losses_of(reference, np.eye(10, dtype="float32")[labels], predictions)
    np.testing.assert_allclose(_losses_of(ours, labels, predictions), expected, rtol=1e-5)
    # Labels shaped (N, 1), as Keras' sparse losses take them too, give the same loss.
    np.testing.assert_allclose(_losses_of(ours, labels[:, None], predictions), expected, rtol=1e-5)


def test_label_smoothing_zero_is_sparse_categorical_crossentropy_and_half_precision_logits_are_computed_in_float32():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 10, size=8)
    logits = rng.normal(scale=3.0, size=(8, 10)).astype("float32")
    sparse = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    np.testing.assert_allclose(
        _losses_of(LabelSmoothingCrossentropy(0.0, from_logits=True), labels, logits),
        _losses_of(sparse, labels, logits),
        rtol=1e-6,
    )
    loss = LabelSmoothingCrossentropy(0.1, from_logits=True)
    half = loss(labels, ops.cast(logits, "float16"))
    assert dtype_of(half) == "float32"
    np.testing.assert_allclose(
        ops.convert_to_numpy(half), _losses_of(loss, labels, logits.astype("float16").astype("float32")), rtol=1e-6
    )


def test_label_smoothing_crossentropy_serializes_and_rejects_bad_values():
    loss = LabelSmoothingCrossentropy(0.2, from_logits=True)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert isinstance(clone, LabelSmoothingCrossentropy)
    assert (clone.label_smoothing, clone.from_logits) == (0.2, True)
    for bad in (-0.1, 1.0, True):
        with pytest.raises(ValueError, match=rf"label_smoothing={bad!r}"):
            LabelSmoothingCrossentropy(bad)
