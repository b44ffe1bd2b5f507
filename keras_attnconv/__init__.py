"""keras_attnconv: a Keras 3 model zoo for "On the Relationship between
Self-Attention and Convolutional Layers" (Cordonnier, Loukas, Jaggi, ICLR 2020).

``import keras_attnconv`` imports Keras and the library (layers, models and
presets, optimizer, analysis), which registers every serializable class of the
package with Keras, as keras-hub does: it is all ``keras.saving.load_model``
needs. The application (``keras_attnconv.training``, ``.export``, ``.bench``,
the ``attnconv`` command) stands above the library and is imported by name.

Where this import is the one that starts Keras' backend, the native libraries'
known start-up lines (absl's preamble, CUDA probing on a machine without a
GPU, the CPU feature notice) are kept off standard error
(`utils.console.native_log_filter`); every other line passes unchanged.
"""

import contextlib as _contextlib
import sys as _sys

from keras_attnconv.utils.console import native_log_filter as _native_log_filter

# TensorFlow's CUDA probe ("failed call to cuInit" on a machine without a GPU) comes with its first op, after this
# import, and is not forced here: starting the runtime at import would read TF_XLA_FLAGS before `attnconv train` sets
# them (`models.element_clusters`) and come before a multi-worker strategy's collective ops are configured.
with _native_log_filter() if "keras" not in _sys.modules else _contextlib.nullcontext():
    from keras_attnconv import layers, models, optim  # noqa: F401 (they register the package's Keras classes)
from keras_attnconv.analysis import compile_for_fine_tuning, conv_to_attention, prune_degenerate_heads
from keras_attnconv.layers import (
    AttentionSpan,
    ConvolutionAsAttention,
    DiagonalGaussianScore,
    GaussianScore,
    InvertibleDownsampling,
    LearnedPositionEmbedding,
    LearnedRelativeScore,
    MirrorAverage,
    MirroredBatch,
    PixelNormalization,
    QuadraticScore,
    RelativeMultiHeadAttention,
    SinusoidalPositionEmbedding,
    SirenScore,
    TransformerEncoderBlock,
)
from keras_attnconv.models import (
    AttentionClassifier,
    ImageClassifier,
    ResNet,
    build_model,
    count_flops,
    from_preset,
    get_model_card,
    get_model_config,
    get_paper_figures,
    list_models,
    register_model,
    save_to_preset,
    with_attention_options,
)
from keras_attnconv.version import __version__

__all__ = [
    "AttentionClassifier",
    "AttentionSpan",
    "ConvolutionAsAttention",
    "DiagonalGaussianScore",
    "GaussianScore",
    "ImageClassifier",
    "InvertibleDownsampling",
    "LearnedPositionEmbedding",
    "LearnedRelativeScore",
    "MirrorAverage",
    "MirroredBatch",
    "PixelNormalization",
    "QuadraticScore",
    "RelativeMultiHeadAttention",
    "ResNet",
    "SinusoidalPositionEmbedding",
    "SirenScore",
    "TransformerEncoderBlock",
    "__version__",
    "analysis",
    "build_model",
    "compile_for_fine_tuning",
    "conv_to_attention",
    "count_flops",
    "from_preset",
    "get_model_card",
    "get_model_config",
    "get_paper_figures",
    "layers",
    "list_models",
    "models",
    "optim",
    "prune_degenerate_heads",
    "register_model",
    "save_to_preset",
    "with_attention_options",
]
