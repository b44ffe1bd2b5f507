"""keras_attnconv: a Keras 3 model zoo for "On the Relationship between
Self-Attention and Convolutional Layers" (Cordonnier, Loukas, Jaggi, ICLR 2020).

The public names are imported on first use (PEP 562), so that
``import keras_attnconv`` and the ``attnconv`` command start without loading
Keras and its backend until something needs them. The package's Keras classes
(layers, models, optimizer, schedule) are registered for deserialization as
soon as Keras is imported, before or after this package, so that
``import keras_attnconv`` is all ``keras.saving.load_model`` needs.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

from keras_attnconv.version import __version__  # noqa: F401 (public)

# public name -> module that defines it
_EXPORTS = {
    "AttentionClassifier": "keras_attnconv.models",
    "AttentionSpan": "keras_attnconv.layers",
    "ConvolutionAsAttention": "keras_attnconv.layers",
    "DiagonalGaussianScore": "keras_attnconv.layers",
    "conv_to_attention": "keras_attnconv.conversion",
    "GaussianScore": "keras_attnconv.layers",
    "ImageClassifier": "keras_attnconv.models",
    "InvertibleDownsampling": "keras_attnconv.layers",
    "LearnedPositionEmbedding": "keras_attnconv.layers",
    "LearnedRelativeScore": "keras_attnconv.layers",
    "PixelNormalization": "keras_attnconv.layers",
    "QuadraticScore": "keras_attnconv.layers",
    "RelativeMultiHeadAttention": "keras_attnconv.layers",
    "ResNet": "keras_attnconv.models",
    "SinusoidalPositionEmbedding": "keras_attnconv.layers",
    "SirenScore": "keras_attnconv.layers",
    "TransformerEncoderBlock": "keras_attnconv.layers",
    "build_model": "keras_attnconv.models",
    "compile_for_fine_tuning": "keras_attnconv.pruning",
    "count_flops": "keras_attnconv.models",
    "from_preset": "keras_attnconv.presets",
    "get_model_config": "keras_attnconv.models",
    "get_paper_figures": "keras_attnconv.models",
    "list_models": "keras_attnconv.models",
    "prune_degenerate_heads": "keras_attnconv.pruning",
    "save_to_preset": "keras_attnconv.presets",
    "with_attention_options": "keras_attnconv.models",
}
_SUBMODULES = ("layers", "models", "optim")  # those that register Keras classes
# Modules the README names as `keras_attnconv.<module>.<name>`, reachable after `import keras_attnconv`.
_PUBLIC_MODULES = (*_SUBMODULES, "analysis", "conversion", "export", "pruning", "viz")

__all__ = sorted([*_EXPORTS, *_PUBLIC_MODULES, "__version__"])


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _PUBLIC_MODULES:
        value = importlib.import_module(f"keras_attnconv.{name}")
    else:
        raise AttributeError(f"module 'keras_attnconv' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return __all__


_registration_pending = False
_finished_modules = set()  # registering modules whose whole body has run (they called `_finish_registration`)


def _register_keras_classes():
    """Imports the modules whose classes are registered with ``keras.saving.register_keras_serializable``.

    When Keras is first imported by one of those modules while it is itself being imported
    (``from keras_attnconv.layers import ...`` as the first import), that module cannot be
    imported again yet: the registration waits until it has finished (`_finish_registration`).
    A module that failed to import is no longer in ``sys.modules`` and holds nothing up.
    """
    global _registration_pending
    if any(f"keras_attnconv.{module}" in sys.modules and module not in _finished_modules for module in _SUBMODULES):
        _registration_pending = True
        return
    _registration_pending = False
    for module in _SUBMODULES:
        try:
            importlib.import_module(f"keras_attnconv.{module}")
        except Exception as error:  # noqa: BLE001 (never break the user's `import keras`)
            warnings.warn(f"keras_attnconv could not register its Keras classes ({error!r}); import "
                          f"keras_attnconv.{module} before loading a model that uses them.", stacklevel=2)


def _finish_registration(module):
    """Called at the end of each registering `module`: its whole body has run; the registration that had to wait."""
    _finished_modules.add(module)
    if _registration_pending:
        _register_keras_classes()


class _RegisterAfterKerasImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the top-level ``keras`` module as usual and registers our classes once it has run."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras":
            return None
        sys.meta_path.remove(self)  # once; the finders below give the real spec
        spec = importlib.util.find_spec("keras")
        if spec is None or spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__spec__.loader = self._loader
        _register_keras_classes()


if "keras" in sys.modules:
    _register_keras_classes()
elif not any(isinstance(finder, _RegisterAfterKerasImport) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterKerasImport())
