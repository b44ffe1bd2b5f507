"""Keras layers of keras_attnconv: relative self-attention over pixels and its parts."""

from keras_attnconv.layers.absolute_position import LearnedPositionEmbedding, SinusoidalPositionEmbedding
from keras_attnconv.layers.attention_span import AttentionSpan
from keras_attnconv.layers.downsampling import InvertibleDownsampling
from keras_attnconv.layers.encoder import TransformerEncoderBlock
from keras_attnconv.layers.position_scores import (
    POSITION_SCORES,
    GaussianScore,
    LearnedRelativeScore,
    PositionScore,
    QuadraticScore,
    SirenScore,
    get_position_score,
)
from keras_attnconv.layers.relative_attention import RelativeMultiHeadAttention

__all__ = [
    "AttentionSpan",
    "POSITION_SCORES",
    "GaussianScore",
    "InvertibleDownsampling",
    "LearnedPositionEmbedding",
    "LearnedRelativeScore",
    "PositionScore",
    "QuadraticScore",
    "RelativeMultiHeadAttention",
    "SinusoidalPositionEmbedding",
    "SirenScore",
    "TransformerEncoderBlock",
    "get_position_score",
]
