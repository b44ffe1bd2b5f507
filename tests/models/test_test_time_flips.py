"""Test-time flips (`ClassifierConfig.test_time_flips`): at inference the mean of an image's and its mirror's logits,
in training the model as it is, with the same weights; every family keeps the model contract with them."""

import keras
import numpy as np
import pytest
from keras import ops
from support import MODEL_CHECKS, ModelCase, dtype_of, small_overrides

import keras_attnconv
from keras_attnconv.layers import MirrorAverage, MirroredBatch

#: One small model of each family, with test-time flips.
CASES = [
    ModelCase(name, {**small_overrides(name), "test_time_flips": True}) for name in ("quadratic_tiny", "resnet_tiny")
]


def _images(case, size=5):
    return case.batch(size)[0]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_logits_are_the_mean_of_the_images_and_their_mirror_images(case):
    flips = case.model()
    plain = flips.with_config(test_time_flips=False)
    images = _images(case)
    expected = (ops.convert_to_numpy(plain(images)) + ops.convert_to_numpy(plain(images[:, :, ::-1]))) / 2
    np.testing.assert_allclose(ops.convert_to_numpy(flips(images)), expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(flips.predict(images, verbose=0), expected, atol=1e-5, rtol=0)
    # Not a no-op: a mirror image gives other logits than the image.
    assert not np.allclose(ops.convert_to_numpy(plain(images)), expected, atol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_training_sees_each_image_once_and_trains_the_same_weights(case):
    # Without dropout, whose random draws differ between two models.
    flips = case.model(**({} if case.name.startswith("resnet") else {"dropout": 0.0, "attention_dropout": 0.0}))
    plain = flips.with_config(test_time_flips=False)
    images, labels = case.batch(8)
    for model in (flips, plain):
        model.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=False)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(flips(images, training=True)), ops.convert_to_numpy(plain(images, training=True))
    )
    flips_loss = flips.train_on_batch(images, labels)
    plain_loss = plain.train_on_batch(images, labels)
    assert flips_loss == pytest.approx(plain_loss, rel=1e-6)
    for after_flips, after_plain in zip(flips.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(after_flips, after_plain, atol=1e-6, rtol=0)


def test_a_trained_model_gets_flips_without_a_weight_changed():
    plain = keras_attnconv.build_model("quadratic_tiny", seed=0, num_layers=1)
    flips = plain.with_config(test_time_flips=True)
    assert flips.count_params() == plain.count_params()
    assert [w.shape for w in flips.weights] == [w.shape for w in plain.weights]
    for a, b in zip(flips.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert flips.preprocessing == plain.preprocessing  # what a client sends and receives does not change


@pytest.mark.parametrize("check", MODEL_CHECKS)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_model_with_flips_meets_the_model_contract(case, check):
    MODEL_CHECKS[check](case)


def test_the_layers_double_and_halve_the_batch_at_inference_only():
    images = np.arange(2 * 2 * 3 * 1, dtype="uint8").reshape(2, 2, 3, 1)
    doubled = ops.convert_to_numpy(MirroredBatch()(images))
    np.testing.assert_array_equal(doubled, np.concatenate([images, images[:, :, ::-1]]))
    np.testing.assert_array_equal(ops.convert_to_numpy(MirroredBatch()(images, training=True)), images)
    outputs = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 8.0], [7.0, 0.0]], "float32")  # 2 images, then their mirrors
    np.testing.assert_array_equal(ops.convert_to_numpy(MirrorAverage()(outputs)), [[3.0, 5.0], [5.0, 2.0]])
    np.testing.assert_array_equal(ops.convert_to_numpy(MirrorAverage()(outputs, training=True)), outputs)
    averaged = MirrorAverage()(ops.cast(outputs, "bfloat16"))
    assert dtype_of(averaged) == "float32"  # the logits' dtype under any policy


def test_images_of_another_rank_are_refused_with_their_shape():
    with pytest.raises(ValueError, match=r"Received: inputs of shape \(2, 3, 1\)"):
        MirroredBatch()(np.zeros((2, 3, 1), "uint8"))


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_value_other_than_true_or_false_is_named(value):
    with pytest.raises(ValueError, match=f"test_time_flips={value!r}"):
        keras_attnconv.get_model_config("quadratic_tiny", test_time_flips=value)


def test_the_attention_drawn_is_that_of_the_image_not_of_its_mirror_image():
    from keras_attnconv.analysis.attention import attention_probabilities

    flips = keras_attnconv.build_model("quadratic_tiny", seed=0, num_layers=2, test_time_flips=True)
    plain = flips.with_config(test_time_flips=False)
    image = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    for drawn, expected in zip(attention_probabilities(flips, image), attention_probabilities(plain, image)):
        np.testing.assert_allclose(drawn, expected, atol=1e-6)
