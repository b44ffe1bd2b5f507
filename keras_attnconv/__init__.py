"""keras_attnconv: a Keras 3 model zoo for "On the Relationship between
Self-Attention and Convolutional Layers" (Cordonnier, Loukas, Jaggi, ICLR 2020).

The public names are imported on first use (PEP 562), so that
``import keras_attnconv`` and the ``attnconv`` command start without loading
Keras and its backend until something needs them.
"""

import importlib

from keras_attnconv.version import __version__  # noqa: F401 (public)

# public name -> module that defines it
_EXPORTS = {
    "ConvolutionAsAttention": "keras_attnconv.layers",
    "DiagonalGaussianScore": "keras_attnconv.layers",
    "conv_to_attention": "keras_attnconv.conversion",
    "GaussianScore": "keras_attnconv.layers",
    "InvertibleDownsampling": "keras_attnconv.layers",
    "LearnedPositionEmbedding": "keras_attnconv.layers",
    "LearnedRelativeScore": "keras_attnconv.layers",
    "QuadraticScore": "keras_attnconv.layers",
    "RelativeMultiHeadAttention": "keras_attnconv.layers",
    "SinusoidalPositionEmbedding": "keras_attnconv.layers",
    "SirenScore": "keras_attnconv.layers",
    "TransformerEncoderBlock": "keras_attnconv.layers",
    "build_model": "keras_attnconv.models",
    "get_model_config": "keras_attnconv.models",
    "get_paper_figures": "keras_attnconv.models",
    "list_models": "keras_attnconv.models",
}
_SUBMODULES = ("layers", "models", "optim")

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "__version__"])


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"keras_attnconv.{name}")
    else:
        raise AttributeError(f"module 'keras_attnconv' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return __all__
