"""Specifications of InvertibleDownsampling: exact inverse, space-to-depth layout, bad sizes."""

import keras
import numpy as np
import pytest
from keras import ops
from support import requires_tensorflow

from keras_attnconv.layers import InvertibleDownsampling


@pytest.mark.parametrize("block_size, shape", [(2, (2, 8, 6, 3)), (4, (1, 8, 8, 2)), (1, (1, 3, 5, 2))])
def test_inverse_is_exact(block_size, shape):
    x = np.random.default_rng(0).normal(size=shape).astype("float32")
    layer = InvertibleDownsampling(block_size)
    y = layer(x)
    assert tuple(y.shape) == (shape[0], shape[1] // block_size, shape[2] // block_size, shape[3] * block_size**2)
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.inverse(y)), x)
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(layer.inverse(y))), ops.convert_to_numpy(y))


@requires_tensorflow
def test_matches_tf_space_to_depth():
    import tensorflow as tf

    x = np.random.default_rng(1).normal(size=(2, 6, 4, 3)).astype("float32")
    np.testing.assert_array_equal(
        ops.convert_to_numpy(InvertibleDownsampling(2)(x)), tf.nn.space_to_depth(x, 2).numpy()
    )


def test_symbolic_shape_and_config():
    layer = InvertibleDownsampling(2)
    assert tuple(layer(keras.Input((32, 32, 3))).shape) == (None, 16, 16, 12)
    assert InvertibleDownsampling.from_config(layer.get_config()).block_size == 2


@pytest.mark.parametrize("shape", [(None, 15, 16, 3), (None, 16, 7, 3)])
def test_odd_image_size_is_rejected(shape):
    with pytest.raises(ValueError, match=r"multiples of block_size=2.*input_shape=\(None, 1[56], 1?[67]"):
        InvertibleDownsampling(2).build(shape)


@pytest.mark.parametrize("block_size", [0, -1, 1.5])
def test_bad_block_size_is_named(block_size):
    with pytest.raises(ValueError, match=f"block_size={block_size!r}"):
        InvertibleDownsampling(block_size)
