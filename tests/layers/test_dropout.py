"""`layers.dropout.Dropout`: Keras' dropout, with ThreeFry masks when traced for XLA on a CPU (TensorFlow)."""

import keras
import numpy as np
import pytest

from keras_attnconv.layers import RelativeMultiHeadAttention, TransformerEncoderBlock
from keras_attnconv.layers.dropout import Dropout, threefry_dropout


def test_outside_xla_it_is_keras_dropout_mask_for_mask():
    x = np.ones((4, 64), "float32")
    ours, theirs = Dropout(0.3, seed=5), keras.layers.Dropout(0.3, seed=5)
    for _ in range(2):  # the same seed stream, call after call
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours(x, training=True)),
                                      keras.ops.convert_to_numpy(theirs(x, training=True)))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours(x, training=False)), x)


def test_under_xla_on_a_cpu_tensorflow_masks_are_threefrys():
    tf = pytest.importorskip("tensorflow")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the ThreeFry draw is TensorFlow's (JAX's masks are ThreeFry already)")
    x = tf.ones((64, 256))
    layer = Dropout(0.25, seed=11)
    seed = keras.ops.convert_to_numpy(layer.seed_generator.state)  # what the layer's next draw uses
    mask = tf.function(lambda x: layer(x, training=True), jit_compile=True)(x).numpy()
    expected = tf.function(lambda x: threefry_dropout(x, 0.25, None, tf.constant(seed)), jit_compile=True)(x)
    np.testing.assert_array_equal(mask, expected.numpy())
    # A dropout mask: the rate's share dropped, the rest scaled to keep the expectation.
    assert set(np.unique(mask)) == {0.0, np.float32(1 / 0.75)}
    assert abs((mask == 0).mean() - 0.25) < 0.01
    assert not np.array_equal(keras.ops.convert_to_numpy(layer.seed_generator.state), seed)  # the stream moved on


def test_noise_shape_shares_the_mask_along_its_none_free_axes_under_xla():
    tf = pytest.importorskip("tensorflow")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the ThreeFry draw is TensorFlow's")
    layer = Dropout(0.5, noise_shape=(None, 1, 8), seed=2)
    mask = tf.function(lambda x: layer(x, training=True), jit_compile=True)(tf.ones((3, 5, 8))).numpy()
    assert (mask == mask[:, :1]).all() and 0 < (mask == 0).mean() < 1


@pytest.mark.parametrize("make", [lambda: TransformerEncoderBlock(2, 8, position_score="quadratic"),
                                  lambda: RelativeMultiHeadAttention(2, dropout=0.1)])
def test_the_attention_layers_drop_with_it(make):
    layer = make()
    layer.build((None, 4, 4, 8))
    assert any(isinstance(sub, Dropout) for sub in layer._flatten_layers())


def test_it_serializes_as_itself():
    layer = Dropout(0.2, noise_shape=(None, 1), seed=3)
    copy = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(copy) is Dropout and copy.get_config() == layer.get_config()
