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
from keras_attnconv.models.presets import from_preset, save_to_preset
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
    "from_preset",
    "get_model_config",
    "get_paper_figures",
    "list_models",
    "save_to_preset",
    "with_attention_options",
]
