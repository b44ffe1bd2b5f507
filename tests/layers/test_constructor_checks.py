"""Every public layer refuses a bad argument in its constructor, naming it: never later, at its first call."""

import pytest

from keras_attnconv.layers import (
    ConvolutionAsAttention,
    GaussianScore,
    PixelNormalization,
    QuadraticScore,
    RelativeMultiHeadAttention,
    TransformerEncoderBlock,
)


def test_an_unknown_position_score_name_is_refused_at_construction_with_the_closest_name():
    with pytest.raises(ValueError, match="Did you mean 'quadratic'.*Received: position_score='quadratc'"):
        RelativeMultiHeadAttention(2, position_score="quadratc")


@pytest.mark.parametrize("score", ["gaussian", GaussianScore(2)], ids=["name", "layer"])
def test_separable_true_on_scores_that_are_not_separable_is_refused_at_construction(score):
    with pytest.raises(ValueError, match="GaussianScore scores are not separable by axis. Received: separable=True"):
        RelativeMultiHeadAttention(2, position_score=score, separable=True)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            {"position_score": QuadraticScore(num_heads=9)},
            r"the attention's heads \(num_heads=4\)\. Received: position_score QuadraticScore with num_heads=9$",
        ),
        (
            {"position_score": QuadraticScore(num_heads=4, head_vectors=False)},
            r"\(use_position_bias=True\)\. Received: position_score QuadraticScore with head_vectors=False$",
        ),
    ],
)
def test_parts_that_do_not_fit_the_attention_are_refused_at_construction_naming_them(arguments, message):
    with pytest.raises(ValueError, match=message):
        RelativeMultiHeadAttention(4, **arguments)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"attention": "x"}, "attention='x'"),
        ({"kernel_size": (3, 0)}, r"kernel_size=\(3, 0\)"),
        ({"kernel_size": (3, 3, 3)}, r"kernel_size=\(3, 3, 3\)"),
        ({"strides": (1,)}, r"must hold 2 positive integers. Received: strides=\(1,\)"),
        ({"dilation_rate": (1, 1.5)}, r"dilation_rate=\(1, 1.5\)"),
        ({"padding": "causal"}, "padding='causal'"),
    ],
)
def test_convolution_as_attention_checks_its_geometry_at_construction(arguments, message):
    valid = {
        "attention": RelativeMultiHeadAttention(9),
        "kernel_size": (3, 3),
        "strides": (1, 1),
        "dilation_rate": (1, 1),
        "padding": "same",
    }
    with pytest.raises(ValueError, match=message):
        ConvolutionAsAttention(**{**valid, **arguments})


@pytest.mark.parametrize(
    "mean, std, named",
    [
        ((0.5, 0.5, 0.5), (1e-50, 0.2, 0.2), "`std`"),  # 1 / std overflows float32 (and std rounds to 0 there)
        ((1e39, 0.5, 0.5), (0.2, 0.2, 0.2), "`mean`"),  # float32's largest number is 3.4e38
        ((1e30, 0.5, 0.5), (1e-10, 0.2, 0.2), "`mean / std`"),
    ],
)
def test_statistics_float32_cannot_hold_are_refused_by_name(mean, std, named):
    with pytest.raises(ValueError, match=f"{named} must be a number float32 can hold"):
        PixelNormalization(mean, std)


def test_a_window_on_a_huge_map_is_refused_before_its_tables_are_made():
    from keras_attnconv.layers.neighbourhood import get_neighbourhood

    with pytest.raises(ValueError, match="index tables.*height=50000, width=50000, window=\\(7, 7\\)"):
        get_neighbourhood(50000, 50000, (7, 7))


def test_encoder_block_attention_options_must_be_a_dict():
    with pytest.raises(
        ValueError, match="a dict of RelativeMultiHeadAttention arguments. Received: attention_options='x'"
    ):
        TransformerEncoderBlock(2, 8, attention_options="x")
