"""Argument checks shared by the layers and the model configs: bad values are named, never raw errors."""

import numpy as np
import pytest

from keras_attnconv.models.attention_classifier import AttentionClassifierConfig
from keras_attnconv.utils.checks import check_positive_number, check_rate


@pytest.mark.parametrize("value", [0, 0.0, 0.5, np.float32(0.99)])
def test_rates_in_zero_one_are_accepted(value):
    check_rate("dropout", value)


@pytest.mark.parametrize("value", [1.0, -0.1, "x", None, True, float("nan")])
def test_other_rates_are_named(value):
    with pytest.raises(ValueError, match=f"dropout={value!r}"):
        check_rate("dropout", value)


@pytest.mark.parametrize("value", [0, -1, "x", float("inf"), float("nan"), True])
def test_non_positive_numbers_are_named(value):
    with pytest.raises(ValueError, match=f"epsilon={value!r}"):
        check_positive_number("epsilon", value)


# The attention classifier's config lives in models/; its field checks are these helpers.
@pytest.mark.parametrize(
    "field, value",
    [
        ("position_embedding_dim", 0),
        ("position_embedding_dim", -4),
        ("initializer_range", -1),
        ("initializer_range", 0.0),
        ("dropout", "x"),
        ("attention_dropout", 1.5),
        ("num_heads", 0),
    ],
)
def test_classifier_config_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=f"{field}={value!r}"):
        AttentionClassifierConfig(position_score="learned", **{field: value})


def test_classifier_config_position_embedding_dim_none_means_hidden_dim():
    config = AttentionClassifierConfig(
        num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=8, position_score="learned", image_size=8
    )
    score = config.build().get_layer("encoder_0").attention.position_score
    assert score.embedding_dim == 8
