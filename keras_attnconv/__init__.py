"""keras_attnconv: a Keras 3 model zoo for "On the Relationship between
Self-Attention and Convolutional Layers" (Cordonnier, Loukas, Jaggi, ICLR 2020)."""

__version__ = "0.1.0"

from keras_attnconv import layers  # noqa: E402
from keras_attnconv.layers import (  # noqa: E402
    GaussianScore,
    InvertibleDownsampling,
    LearnedRelativeScore,
    QuadraticScore,
    RelativeMultiHeadAttention,
    TransformerEncoderBlock,
)
