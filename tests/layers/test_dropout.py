"""`layers.dropout.Dropout`: Keras' dropout, with ThreeFry masks when traced for XLA on a CPU (TensorFlow)."""

import keras
import numpy as np
import pytest

from keras_attnconv.layers import RelativeMultiHeadAttention, TransformerEncoderBlock
from keras_attnconv.layers.dropout import Dropout, draws_threefry_under_xla, threefry_dropout


def test_outside_xla_it_is_keras_dropout_mask_for_mask():
    x = np.ones((4, 64), "float32")
    ours, theirs = Dropout(0.3, seed=5), keras.layers.Dropout(0.3, seed=5)
    for _ in range(2):  # the same seed stream, call after call
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(ours(x, training=True)), keras.ops.convert_to_numpy(theirs(x, training=True))
        )
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours(x, training=False)), x)


def _xla_on_a_cpu_tensorflow():
    """TensorFlow, or the test is skipped: the ThreeFry draw is TensorFlow's, on a CPU (JAX's masks are ThreeFry
    already, and elsewhere the layer is Keras')."""
    if not draws_threefry_under_xla():
        pytest.skip("ThreeFry masks are drawn by TensorFlow's XLA on a CPU only")
    import tensorflow as tf

    return tf


@pytest.mark.parametrize("precision", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_under_xla_on_a_cpu_tensorflow_masks_are_threefrys(precision):
    tf = _xla_on_a_cpu_tensorflow()
    x = tf.ones((64, 256), keras.DTypePolicy(precision).compute_dtype)
    layer, keras_layer = Dropout(0.25, seed=11, dtype=precision), keras.layers.Dropout(0.25, seed=11, dtype=precision)
    seed = keras.ops.convert_to_numpy(layer.seed_generator.state)  # what the layer's next draw uses
    mask = tf.function(lambda x: layer(x, training=True), jit_compile=True)(x).numpy().astype("float32")
    expected = tf.function(lambda x: threefry_dropout(x, 0.25, None, tf.constant(seed)), jit_compile=True)(x)
    np.testing.assert_array_equal(mask, expected.numpy().astype("float32"))
    keras_mask = tf.function(lambda x: keras_layer(x, training=True), jit_compile=True)(x).numpy().astype("float32")
    assert not np.array_equal(mask == 0, keras_mask == 0)  # other bits than Keras' (Philox) from the same seed
    # A dropout mask: the rate's share dropped, the rest scaled to keep the expectation.
    assert set(np.unique(mask)) == {0.0, tf.cast(tf.cast(1 / 0.75, x.dtype), "float32").numpy()}
    assert abs((mask == 0).mean() - 0.25) < 0.01
    assert not np.array_equal(keras.ops.convert_to_numpy(layer.seed_generator.state), seed)  # the stream moved on


def test_noise_shape_shares_the_mask_along_its_unit_axes_under_xla():
    tf = _xla_on_a_cpu_tensorflow()
    layer = Dropout(0.5, noise_shape=(None, 1, 8), seed=2)
    mask = tf.function(lambda x: layer(x, training=True), jit_compile=True)(tf.ones((16, 5, 8))).numpy()
    assert (mask == mask[:, :1]).all()  # one mask along the axis of size 1 in noise_shape
    assert len({row.tobytes() for row in mask[:, 0]}) > 1  # the None axis (the batch) is drawn per example


def test_rate_one_drops_everything_under_xla_as_keras_does():
    tf = _xla_on_a_cpu_tensorflow()
    layer = Dropout(1.0, seed=2)
    assert not tf.function(lambda x: layer(x, training=True), jit_compile=True)(tf.ones((2, 3))).numpy().any()


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
