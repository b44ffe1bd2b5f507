"""Every public layer refuses a bad argument in its constructor, naming it: never later, at its first call."""

import pytest

from keras_attnconv.layers import ConvolutionAsAttention, PixelNormalization, RelativeMultiHeadAttention


def test_an_unknown_position_score_name_is_refused_at_construction_with_the_closest_name():
    with pytest.raises(ValueError, match="Did you mean 'quadratic'.*Received: position_score='quadratc'"):
        RelativeMultiHeadAttention(2, position_score="quadratc")


@pytest.mark.parametrize("arguments, message", [
    ({"attention": "x"}, "attention='x'"),
    ({"kernel_size": (3, 0)}, r"kernel_size=\(3, 0\)"),
    ({"kernel_size": (3, 3, 3)}, r"kernel_size=\(3, 3, 3\)"),
    ({"strides": (1,)}, r"must hold 2 positive integers. Received: strides=\(1,\)"),
    ({"dilation_rate": (1, 1.5)}, r"dilation_rate=\(1, 1.5\)"),
    ({"padding": "causal"}, "padding='causal'"),
])
def test_convolution_as_attention_checks_its_geometry_at_construction(arguments, message):
    valid = {"attention": RelativeMultiHeadAttention(9), "kernel_size": (3, 3), "strides": (1, 1),
             "dilation_rate": (1, 1), "padding": "same"}
    with pytest.raises(ValueError, match=message):
        ConvolutionAsAttention(**{**valid, **arguments})
