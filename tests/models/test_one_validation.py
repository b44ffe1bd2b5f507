"""A config is validated once per build: the entry points hand the validated config on instead of checking it again."""

import pytest

import keras_attnconv


def test_build_model_with_overrides_validates_once(validation_counts):
    keras_attnconv.build_model("quadratic_tiny", image_size=16, num_layers=1)
    assert validation_counts == {"validations": 1, "builds": 1}


def test_build_model_of_a_registered_config_reuses_its_validation(validation_counts):
    keras_attnconv.build_model("resnet_tiny")
    assert validation_counts == {"validations": 0, "builds": 1}  # validated once, when its family registered it


def test_a_model_from_its_fields_and_its_reload_validate_once_each(validation_counts, tmp_path):
    model = keras_attnconv.AttentionClassifier(num_layers=1, hidden_dim=16, intermediate_dim=16, image_size=8)
    keras_attnconv.save_to_preset(model, tmp_path / "preset")
    keras_attnconv.from_preset(str(tmp_path / "preset"))
    assert validation_counts == {"validations": 2, "builds": 2}


def test_a_config_given_to_the_model_is_taken_alone():
    config = keras_attnconv.get_model_config("resnet_tiny")
    with pytest.raises(
        ValueError,
        match="`config`, a ResNetConfig .* alone. Received: config of class ResNetConfig and the fields widths",
    ):
        keras_attnconv.ResNet(config=config, widths=(8, 8, 8))
    with pytest.raises(ValueError, match="Received: config of class AttentionClassifierConfig"):
        keras_attnconv.ResNet(config=keras_attnconv.get_model_config("quadratic_tiny"))
