"""The ResNet family: its configurations' paper sizes, and the model contract."""

import pytest
from support import MODEL_CHECKS, family_cases

import keras_attnconv
from keras_attnconv.models.summary import trainable_parameters

PAPER_SIZES = {"resnet18": 11.2, "resnet10": 4.9}


@pytest.mark.parametrize("name", sorted(PAPER_SIZES))
def test_parameter_count_within_one_percent_of_the_paper(name):
    params = trainable_parameters(keras_attnconv.build_model(name)) / 1e6
    assert params == pytest.approx(PAPER_SIZES[name], rel=0.01)
    assert keras_attnconv.get_paper_figures(name).params_millions == PAPER_SIZES[name]


@pytest.mark.parametrize("check", MODEL_CHECKS)
@pytest.mark.parametrize("case", family_cases("ResNet"), ids=lambda case: case.name)
def test_every_configuration_meets_the_model_contract(case, check):
    MODEL_CHECKS[check](case)
