"""keras_attnconv: a Keras 3 model zoo for "On the Relationship between
Self-Attention and Convolutional Layers" (Cordonnier, Loukas, Jaggi, ICLR 2020)."""

__version__ = "0.1.0"

from keras_attnconv import layers, models, optim
from keras_attnconv.conversion import ConvolutionAsAttention, conv_to_attention
from keras_attnconv.layers import (
    GaussianScore,
    InvertibleDownsampling,
    LearnedPositionEmbedding,
    LearnedRelativeScore,
    QuadraticScore,
    RelativeMultiHeadAttention,
    SinusoidalPositionEmbedding,
    SirenScore,
    TransformerEncoderBlock,
)
from keras_attnconv.models import build_model, get_model_config, get_paper_figures, list_models

__all__ = [
    "ConvolutionAsAttention",
    "GaussianScore",
    "InvertibleDownsampling",
    "LearnedPositionEmbedding",
    "LearnedRelativeScore",
    "QuadraticScore",
    "RelativeMultiHeadAttention",
    "SinusoidalPositionEmbedding",
    "SirenScore",
    "TransformerEncoderBlock",
    "build_model",
    "conv_to_attention",
    "get_model_config",
    "get_paper_figures",
    "layers",
    "list_models",
    "models",
    "optim",
]
