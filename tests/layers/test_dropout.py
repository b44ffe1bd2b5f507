"""`layers.dropout.Dropout`: Keras' dropout, with masks of its own on a CPU (TensorFlow): ThreeFry when traced
for XLA, 16-bit Philox draws otherwise."""

import keras
import numpy as np
import pytest

from keras_attnconv.layers import RelativeMultiHeadAttention, TransformerEncoderBlock
from keras_attnconv.layers.dropout import (
    SIXTEEN_BITS,
    Dropout,
    draws_own_masks,
    sixteen_bit_dropout,
    sixteen_bit_threshold,
    threefry_dropout,
)


def test_where_it_draws_no_masks_of_its_own_it_is_keras_dropout_mask_for_mask():
    if draws_own_masks():
        pytest.skip("TensorFlow on a CPU: the layer draws its own masks (the tests below)")
    x = np.ones((4, 64), "float32")
    ours, theirs = Dropout(0.3, seed=5), keras.layers.Dropout(0.3, seed=5)
    for _ in range(2):  # the same seed stream, call after call
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(ours(x, training=True)), keras.ops.convert_to_numpy(theirs(x, training=True))
        )
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours(x, training=False)), x)


def _tensorflow_on_a_cpu():
    """TensorFlow, or the test is skipped: the layer draws its own masks with TensorFlow on a CPU only (JAX's
    masks are ThreeFry already, and elsewhere the layer is Keras')."""
    if not draws_own_masks():
        pytest.skip("the layer draws its own masks with TensorFlow on a CPU only")
    import tensorflow as tf

    return tf


def _as_float32(mask):
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(mask, "float32")))


def _check_is_a_dropout_mask(mask, rate, scale):
    """The rate's share of the entries dropped, the rest scaled by `scale` to keep the expectation."""
    assert set(np.unique(mask)) == {0.0, float(scale)}
    assert abs((mask == 0).mean() - rate) < 0.01


def _keras_mask(precision, rate, seed, x, jit_compile):
    tf = _tensorflow_on_a_cpu()
    keras_layer = keras.layers.Dropout(rate, seed=seed, dtype=precision)
    return _as_float32(tf.function(lambda x: keras_layer(x, training=True), jit_compile=jit_compile)(x))


@pytest.mark.parametrize("precision", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_under_xla_on_a_cpu_tensorflow_masks_are_threefrys(precision):
    tf = _tensorflow_on_a_cpu()
    x = tf.ones((64, 256), keras.DTypePolicy(precision).compute_dtype)
    layer = Dropout(0.25, seed=11, dtype=precision)
    seed = keras.ops.convert_to_numpy(layer.seed_generator.state)  # what the layer's next draw uses
    mask = _as_float32(tf.function(lambda x: layer(x, training=True), jit_compile=True)(x))
    expected = tf.function(lambda x: threefry_dropout(x, 0.25, None, tf.constant(seed)), jit_compile=True)(x)
    np.testing.assert_array_equal(mask, _as_float32(expected))
    assert not np.array_equal(mask == 0, _keras_mask(precision, 0.25, 11, x, True) == 0)  # other bits than Philox's
    _check_is_a_dropout_mask(mask, 0.25, _as_float32(tf.cast(1 / 0.75, x.dtype)))
    assert not np.array_equal(keras.ops.convert_to_numpy(layer.seed_generator.state), seed)  # the stream moved on


@pytest.mark.parametrize("precision", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_outside_xla_on_a_cpu_tensorflow_masks_are_sixteen_bit_draws_eager_and_in_a_graph_alike(precision):
    tf = _tensorflow_on_a_cpu()
    x = tf.ones((64, 255), keras.DTypePolicy(precision).compute_dtype)  # an odd count: one half-word unused
    eager_layer, graph_layer = Dropout(0.25, seed=11, dtype=precision), Dropout(0.25, seed=11, dtype=precision)
    seed = keras.ops.convert_to_numpy(graph_layer.seed_generator.state)
    graph_mask = _as_float32(tf.function(lambda x: graph_layer(x, training=True))(x))
    np.testing.assert_array_equal(graph_mask, _as_float32(sixteen_bit_dropout(x, 0.25, None, tf.constant(seed))))
    np.testing.assert_array_equal(_as_float32(eager_layer(x, training=True)), graph_mask)
    assert not np.array_equal(graph_mask == 0, _keras_mask(precision, 0.25, 11, x, False) == 0)
    # 0.25 is a multiple of 2**-16: Keras' scale, 1 / (1 - rate)
    _check_is_a_dropout_mask(graph_mask, 0.25, _as_float32(tf.cast(1 / 0.75, x.dtype)))
    assert not np.array_equal(keras.ops.convert_to_numpy(graph_layer.seed_generator.state), seed)
    next_mask = _as_float32(tf.function(lambda x: graph_layer(x, training=True))(x))
    assert not np.array_equal(next_mask, graph_mask)  # each call draws anew


def test_sixteen_bit_draws_round_the_rate_and_scale_by_the_share_kept():
    tf = _tensorflow_on_a_cpu()
    assert sixteen_bit_threshold(0.1) == 6554 and sixteen_bit_threshold(0.5) == SIXTEEN_BITS // 2
    mask = _as_float32(sixteen_bit_dropout(tf.ones((512, 512)), 1 / 3, None, tf.constant([3, 4])))
    threshold = sixteen_bit_threshold(1 / 3)  # 21,845 of 65,536: the share kept is 43,691 / 65,536, not 2/3
    _check_is_a_dropout_mask(mask, 1 / 3, np.float32(SIXTEEN_BITS / (SIXTEEN_BITS - threshold)))


@pytest.mark.parametrize("rate", [1e-9, 1 - 1e-9])
def test_a_rate_at_either_end_drops_something_keeps_something_and_its_gradient_is_finite(rate):
    tf = _tensorflow_on_a_cpu()
    assert 0 < sixteen_bit_threshold(rate) < SIXTEEN_BITS
    x = tf.ones((256, 1024))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = sixteen_bit_dropout(x, rate, None, tf.constant([1, 2]))
    gradient = tape.gradient(y, x).numpy()
    assert np.isfinite(y.numpy()).all() and np.isfinite(gradient).all()
    assert (y.numpy() == 0).any() and (y.numpy() != 0).any()


@pytest.mark.parametrize("jit_compile", [True, False])
def test_noise_shape_shares_the_mask_along_its_unit_axes(jit_compile):
    tf = _tensorflow_on_a_cpu()
    layer = Dropout(0.5, noise_shape=(None, 1, 8), seed=2)
    mask = tf.function(lambda x: layer(x, training=True), jit_compile=jit_compile)(tf.ones((16, 5, 8))).numpy()
    assert (mask == mask[:, :1]).all()  # one mask along the axis of size 1 in noise_shape
    assert len({row.tobytes() for row in mask[:, 0]}) > 1  # the None axis (the batch) is drawn per example


@pytest.mark.parametrize("jit_compile", [True, False])
def test_rate_one_drops_everything_as_keras_does(jit_compile):
    tf = _tensorflow_on_a_cpu()
    layer = Dropout(1.0, seed=2)
    assert not tf.function(lambda x: layer(x, training=True), jit_compile=jit_compile)(tf.ones((2, 3))).numpy().any()


@pytest.mark.parametrize(
    "make",
    [
        lambda: TransformerEncoderBlock(2, 8, position_score="quadratic"),
        lambda: RelativeMultiHeadAttention(2, dropout=0.1),
    ],
)
def test_the_attention_layers_drop_with_it(make):
    layer = make()
    layer.build((None, 4, 4, 8))
    assert any(isinstance(sub, Dropout) for sub in layer._flatten_layers())


def test_it_serializes_as_itself():
    layer = Dropout(0.2, noise_shape=(None, 1), seed=3)
    copy = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(copy) is Dropout and copy.get_config() == layer.get_config()
