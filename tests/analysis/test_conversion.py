"""Theorem 1: a converted convolution and its attention compute the same function."""

import re

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keras import ops

from keras_attnconv.analysis.conversion import conv_to_attention, measure_conversion
from keras_attnconv.layers import ConvolutionAsAttention


def assert_same_function(conv, shape, seed=0):
    x = np.random.default_rng(seed).normal(size=shape).astype("float32")
    expected = ops.convert_to_numpy(conv(x))
    layer = conv_to_attention(conv)
    got = ops.convert_to_numpy(layer(x))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * np.abs(expected).max())
    return layer


CASES = [
    (k, s, d, p, b)
    for k in (1, 3, 5)
    for s, d in ((1, 1), (2, 1), (1, 2))
    for p in ("same", "valid")
    for b in (True, False)
]


@pytest.mark.parametrize("kernel, strides, dilation, padding, bias", CASES)
def test_conv2d_equals_its_attention(kernel, strides, dilation, padding, bias):
    conv = keras.layers.Conv2D(
        5,
        kernel,
        strides=strides,
        dilation_rate=dilation,
        padding=padding,
        use_bias=bias,
        bias_initializer="random_normal",
    )
    layer = assert_same_function(conv, (2, 11, 12, 3))
    assert layer.attention.num_heads == kernel * kernel
    assert not layer.attention.uses_content  # position-only quadratic heads


@pytest.mark.parametrize("kernel, strides, dilation, padding, bias", CASES)
def test_conv1d_equals_its_attention(kernel, strides, dilation, padding, bias):
    conv = keras.layers.Conv1D(
        4,
        kernel,
        strides=strides,
        dilation_rate=dilation,
        padding=padding,
        use_bias=bias,
        bias_initializer="random_normal",
    )
    layer = assert_same_function(conv, (2, 13, 3))
    assert layer.attention.num_heads == kernel


def test_heads_sit_on_the_dilated_kernel_grid():
    conv = keras.layers.Conv2D(2, 3, dilation_rate=2, padding="same")
    conv.build((None, 8, 8, 1))
    centers = ops.convert_to_numpy(conv_to_attention(conv).attention.position_score.centers)
    assert sorted(map(tuple, centers.tolist())) == [(i, j) for i in (0, 2, 4) for j in (0, 2, 4)]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kernel_h=st.integers(1, 4),
    kernel_w=st.integers(1, 4),
    height=st.integers(4, 9),
    width=st.integers(4, 9),
    channels_in=st.integers(1, 4),
    channels_out=st.integers(1, 5),
    strides=st.integers(1, 3),
    padding=st.sampled_from(["same", "valid"]),
    seed=st.integers(0, 1000),
)
def test_property_any_shape(kernel_h, kernel_w, height, width, channels_in, channels_out, strides, padding, seed):
    if padding == "valid" and (kernel_h > height or kernel_w > width):
        return
    conv = keras.layers.Conv2D(
        channels_out, (kernel_h, kernel_w), strides=strides, padding=padding, bias_initializer="random_normal"
    )
    assert_same_function(conv, (1, height, width, channels_in), seed=seed)


def test_converted_layer_serializes_and_compiles_with_xla(tmp_path):
    conv = keras.layers.Conv2D(4, 3, strides=2, padding="same", bias_initializer="random_normal")
    conv.build((None, 8, 8, 3))
    inputs = keras.Input((8, 8, 3))
    outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(conv_to_attention(conv)(inputs)))
    model = keras.Model(inputs, outputs)
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype("float32")
    path = tmp_path / "converted.keras"
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(ops.convert_to_numpy(restored(x)), ops.convert_to_numpy(model(x)))
    assert isinstance(restored.layers[1], ConvolutionAsAttention)
    restored.compile(optimizer="sgd", loss="mse", jit_compile=True)
    assert np.isfinite(restored.train_on_batch(x, np.zeros((4, 2), "float32")))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: keras.layers.Conv2D(4, 3, groups=2), "groups=2"),
        (lambda: keras.layers.Conv1D(4, 3, padding="causal"), "padding='causal'"),
        (lambda: keras.layers.Conv2D(4, 3, data_format="channels_first"), "data_format='channels_first'"),
        (lambda: keras.layers.Conv2D(4, 3, activation="relu"), "activation='relu'"),
        (lambda: keras.layers.Dense(3), "Conv1D or Conv2D"),
    ],
)
def test_unsupported_convolutions_are_rejected(make, message):
    layer = make()
    layer.build((None, 8, 8, 4) if not isinstance(layer, keras.layers.Conv1D) else (None, 8, 4))
    with pytest.raises(ValueError, match=message):
        conv_to_attention(layer)


def test_unbuilt_convolution_is_rejected():
    with pytest.raises(ValueError, match="must be built"):
        conv_to_attention(keras.layers.Conv2D(4, 3))


def test_measure_conversion_reports_the_attention_and_its_error():
    measured = measure_conversion(
        filters=5, kernel_size=3, strides=2, padding="valid", dilation=1, size=9, channels=2, seed=3
    )
    assert (measured.num_heads, measured.output_shape) == (9, (2, 4, 4, 5))
    assert 0 < measured.max_abs_error < 1e-5 and 0 < measured.relative_error < 1e-5
    assert measured.relative_error != measured.max_abs_error  # divided by the convolution's largest output
    assert (
        measure_conversion(filters=5, kernel_size=3, strides=2, padding="valid", size=9, channels=2, seed=3) == measured
    )  # seeded: the same report again


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), 0.0, -1.0, 1e39])
def test_an_alpha_that_is_not_a_positive_float32_number_is_refused_by_name(alpha):
    # Each would give another function than the convolution's (no attention, NaN scores, or the uniform average).
    conv = keras.layers.Conv2D(2, 3, padding="same")
    conv.build((None, 8, 8, 1))
    with pytest.raises(ValueError, match=re.escape(f"Received: alpha={alpha}")):
        conv_to_attention(conv, alpha=alpha)


@pytest.mark.parametrize(
    "arguments, message",
    [({"size": 10**6}, "The images.*size=1000000"), ({"filters": 10**9}, "kernel.*filters=1000000000")],
)
def test_measure_conversion_names_a_size_beyond_the_limit_before_allocating(arguments, message):
    with pytest.raises(ValueError, match=message):
        measure_conversion(**arguments)
