"""Absolute position encodings: the learned table and 2-D sinusoids.

Config and `.keras` round trips, XLA and dtype policies: test_keras_conformance.py.
"""

import numpy as np
import pytest
from keras import ops
from support import dtype_of

from keras_attnconv.layers import LearnedPositionEmbedding, SinusoidalPositionEmbedding
from keras_attnconv.layers.absolute_position import sinusoid_table


def test_sinusoids_follow_the_transformer_formula_per_axis():
    table = sinusoid_table(3, 5, 8)  # 4 channels for rows, 4 for columns
    i, j = 2, 3
    expected_row = [np.sin(i), np.cos(i), np.sin(i / 100.0), np.cos(i / 100.0)]  # 10000^(-2k/4)
    expected_col = [np.sin(j), np.cos(j), np.sin(j / 100.0), np.cos(j / 100.0)]
    np.testing.assert_allclose(table[i, j], expected_row + expected_col, rtol=1e-6)
    layer = SinusoidalPositionEmbedding()
    out = ops.convert_to_numpy(layer(np.zeros((2, 3, 5, 8), "float32")))
    np.testing.assert_allclose(out[1], table)
    assert layer.weights == []


def test_learned_table_is_one_trainable_vector_per_pixel():
    layer = LearnedPositionEmbedding()
    x = np.zeros((2, 4, 6, 8), "float32")
    out = ops.convert_to_numpy(layer(x))
    assert [tuple(w.shape) for w in layer.trainable_weights] == [(4, 6, 8)]
    np.testing.assert_array_equal(out[0], out[1])
    assert 0.01 < out.std() < 0.03  # N(0, 0.02^2)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="channels=6"):
        SinusoidalPositionEmbedding()(np.zeros((1, 4, 4, 6), "float32"))
    with pytest.raises(ValueError, match="max_wavelength=1"):
        SinusoidalPositionEmbedding(max_wavelength=1)
    layer = LearnedPositionEmbedding()
    layer(np.zeros((1, 4, 4, 8), "float32"))
    with pytest.raises(ValueError, match=r"input_shape=\(1, 5, 4, 8\)"):
        layer(np.zeros((1, 5, 4, 8), "float32"))


@pytest.mark.parametrize("layer", [LearnedPositionEmbedding, SinusoidalPositionEmbedding])
@pytest.mark.parametrize("dtype", ["uint8", "int32"])
def test_integer_inputs_get_the_float_encoding(layer, dtype):
    x = np.random.default_rng(0).integers(0, 256, size=(2, 4, 4, 8))
    layer = layer()
    expected = ops.convert_to_numpy(layer(x.astype("float32")))
    encoding = layer(x.astype(dtype))
    assert dtype_of(encoding) == "float32"
    np.testing.assert_array_equal(ops.convert_to_numpy(encoding), expected)
    assert np.abs(expected).max() > 0.01
