"""Keras layers of keras_attnconv: relative self-attention over pixels and its parts, one layer per module."""

from keras_attnconv.layers.absolute_position import LearnedPositionEmbedding, SinusoidalPositionEmbedding
from keras_attnconv.layers.attention_span import AttentionSpan
from keras_attnconv.layers.convolution_as_attention import ConvolutionAsAttention
from keras_attnconv.layers.downsampling import InvertibleDownsampling
from keras_attnconv.layers.encoder import TransformerEncoderBlock
from keras_attnconv.layers.fan_in_uniform import FanInUniform
from keras_attnconv.layers.gaussian_score import DiagonalGaussianScore, GaussianScore
from keras_attnconv.layers.learned_relative_score import LearnedRelativeScore
from keras_attnconv.layers.mirror_average import MirrorAverage
from keras_attnconv.layers.mirrored_batch import MirroredBatch
from keras_attnconv.layers.pixel_normalization import PixelNormalization
from keras_attnconv.layers.position_score import PositionScore
from keras_attnconv.layers.position_score_factory import POSITION_SCORES, get_position_score, register_position_score
from keras_attnconv.layers.quadratic_score import QuadraticScore
from keras_attnconv.layers.relative_attention import RelativeMultiHeadAttention
from keras_attnconv.layers.siren_score import SirenScore

# The weights that place and shape attention heads (centers, widths, covariances, spans), by name: the
# official code gives them no weight decay (`CoupledWeightDecaySGD(no_decay_names=...)`).
CENTER_AND_SPREAD_WEIGHTS = tuple(
    sorted(
        {
            name
            for layer in (QuadraticScore, GaussianScore, DiagonalGaussianScore, AttentionSpan)
            for name in layer.center_and_spread_weights
        }
    )
)

__all__ = [
    "AttentionSpan",
    "CENTER_AND_SPREAD_WEIGHTS",
    "ConvolutionAsAttention",
    "DiagonalGaussianScore",
    "FanInUniform",
    "POSITION_SCORES",
    "GaussianScore",
    "InvertibleDownsampling",
    "LearnedPositionEmbedding",
    "LearnedRelativeScore",
    "MirrorAverage",
    "MirroredBatch",
    "PixelNormalization",
    "PositionScore",
    "QuadraticScore",
    "RelativeMultiHeadAttention",
    "SinusoidalPositionEmbedding",
    "SirenScore",
    "TransformerEncoderBlock",
    "get_position_score",
    "register_position_score",
]
