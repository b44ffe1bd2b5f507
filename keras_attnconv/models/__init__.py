"""The model zoo: the paper's attention classifiers and ResNet baselines."""

from keras_attnconv.models.attention_classifier import AttentionClassifierConfig, build_attention_classifier
from keras_attnconv.models.registry import (
    PaperFigures,
    build_model,
    get_model_config,
    get_paper_figures,
    list_models,
)
from keras_attnconv.models.resnet import ResNetConfig, build_resnet

__all__ = [
    "AttentionClassifierConfig",
    "PaperFigures",
    "ResNetConfig",
    "build_attention_classifier",
    "build_model",
    "build_resnet",
    "get_model_config",
    "get_paper_figures",
    "list_models",
]
