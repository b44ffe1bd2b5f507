"""The model zoo: the paper's attention classifiers and ResNet baselines, one `keras.Model` class per family."""

from keras_attnconv.models.attention_classifier import (
    AttentionClassifier,
    AttentionClassifierConfig,
    with_attention_options,
)
from keras_attnconv.models.flops import count_flops
from keras_attnconv.models.image_classifier import ClassifierConfig, ImageClassifier
from keras_attnconv.models.registry import (
    PaperFigures,
    build_model,
    get_model_config,
    get_paper_figures,
    list_models,
)
from keras_attnconv.models.resnet import ResNet, ResNetConfig

__all__ = [
    "AttentionClassifier",
    "AttentionClassifierConfig",
    "ClassifierConfig",
    "ImageClassifier",
    "PaperFigures",
    "ResNet",
    "ResNetConfig",
    "build_model",
    "count_flops",
    "get_model_config",
    "get_paper_figures",
    "list_models",
    "with_attention_options",
]


# Keras may have been imported while this module was (the package registers its classes then): finish that.
import keras_attnconv  # noqa: E402

keras_attnconv._finish_registration("models")
