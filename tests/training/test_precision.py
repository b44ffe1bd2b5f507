"""One precision rule: models take any floating-point policy, training runs those with float32 weights."""

import keras
import pytest

import keras_attnconv
from keras_attnconv.models.precision import POLICY_NAMES, PRECISIONS, variable_dtype
from keras_attnconv.training.recipe import TrainConfig


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_name_is_a_floating_point_keras_policy_with_the_stated_weights(name):
    policy = keras.DTypePolicy(name)
    assert keras.backend.is_float_dtype(policy.compute_dtype)
    assert policy.variable_dtype == variable_dtype(name)


def test_training_precisions_are_the_policies_that_keep_float32_weights():
    assert PRECISIONS == tuple(name for name in POLICY_NAMES if keras.DTypePolicy(name).variable_dtype == "float32")
    assert PRECISIONS == ("float32", "mixed_bfloat16", "mixed_float16")


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_build_model_takes_every_policy_name_and_a_run_only_the_training_precisions(name):
    model = keras_attnconv.build_model("quadratic_tiny", dtype=name)
    assert model.dtype_policy.name == name
    if name in PRECISIONS:
        assert TrainConfig(model="quadratic_tiny", precision=name).precision == name
    else:
        with pytest.raises(ValueError, match=rf"keep float32 weights.*dtype='{name}'.*Received: precision='{name}'"):
            TrainConfig(model="quadratic_tiny", precision=name)


@pytest.mark.parametrize("bad", ["mixed_bf16", "float", "int8_from_float32", "int32", 32, None])
def test_a_name_that_is_no_policy_is_refused_alike_by_both(bad):
    if bad is not None:  # None is Keras' global policy for a model, and no precision for a run
        with pytest.raises(ValueError, match=r"`dtype` must .*Received: dtype="):
            keras_attnconv.build_model("quadratic_tiny", dtype=bad)
    with pytest.raises(ValueError, match=r"`precision` must be a floating-point dtype policy.*Received: precision="):
        TrainConfig(model="quadratic_tiny", precision=bad)


def test_a_misspelt_policy_gets_the_closest_names():
    with pytest.raises(ValueError, match="Did you mean 'mixed_bfloat16'"):
        TrainConfig(model="quadratic_tiny", precision="mixed_bfloat61")
    with pytest.raises(ValueError, match="Did you mean 'mixed_bfloat16'"):
        keras_attnconv.build_model("quadratic_tiny", dtype="mixed_bfloat61")
