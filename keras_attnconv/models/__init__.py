"""The model zoo: one folder per model family, the registry that collects their names, presets, FLOPs.

A family's folder holds its config, its `ImageClassifier` subclass and its
named configurations, which it registers when imported: a new family is a new
folder and one import line below.
"""

from keras_attnconv.models import attention_classifier, resnet  # noqa: F401  (each family registers its names)
from keras_attnconv.models.attention_classifier import (
    AttentionClassifier,
    AttentionClassifierConfig,
    with_attention_options,
)
from keras_attnconv.models.flops import count_flops
from keras_attnconv.models.image_classifier import ClassifierConfig, ImageClassifier
from keras_attnconv.models.model_card import ModelCard, PaperFigures, TrainedResult
from keras_attnconv.models.presets import save_to_preset
from keras_attnconv.models.registry import (
    build_model,
    from_preset,
    get_model_card,
    get_model_config,
    get_paper_figures,
    list_models,
    register_model,
)
from keras_attnconv.models.resnet import ResNet, ResNetConfig

__all__ = [
    "AttentionClassifier",
    "AttentionClassifierConfig",
    "ClassifierConfig",
    "ImageClassifier",
    "ModelCard",
    "PaperFigures",
    "ResNet",
    "ResNetConfig",
    "TrainedResult",
    "build_model",
    "count_flops",
    "from_preset",
    "get_model_card",
    "get_model_config",
    "get_paper_figures",
    "list_models",
    "register_model",
    "save_to_preset",
    "with_attention_options",
]
