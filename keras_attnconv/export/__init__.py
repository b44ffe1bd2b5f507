"""Export of a model of the zoo, under its own name, as a TF Serving SavedModel, an ONNX file or a LiteRT file.

Every export is ``<export_dir>/<name>/<version>/``: ``<name>`` is the
model's own name (``model.name``, the registered name for `build_model`), or a
serving name given explicitly, which must be a plain name (letters, digits,
``_``, ``-``, ``.``; never a path) and is recorded beside the model's real name
in ``metadata.json``. Nothing is written outside `export_dir`.

- ``saved_model`` (TF Serving): the signature ``serving_default`` takes
  ``images``: uint8 ``[batch, H, W, 3]`` and returns ``probabilities``
  (float32 ``[batch, classes]``), ``classes`` (int64 ``[batch]``) and
  ``class_names`` (string ``[batch]``); ``assets.extra/`` holds the warm-up
  requests TF Serving replays at load time and ``metadata.json``.
- ``onnx`` (onnxruntime) and ``litert`` (the LiteRT interpreter): the model
  itself, ``model.onnx`` or ``model.tflite``, from ``images`` (uint8) to
  float32 logits, with ``metadata.json`` beside it (the ONNX file also carries
  the model's name and class names in its metadata properties).

The models take the raw pixels and normalise them themselves, so every format
takes uint8 images. A model trained in mixed precision is exported as its
float32 copy.

Where each export goes, its version number, and TF Serving's ``models.config``
(merged, never rewritten) are the export root's (`root.ExportRoot`):
a version is written under a hidden staging name and renamed onto its number,
never overwritten, and publishing a version does not change the version TF
Serving serves (a model's first version is served when it appears;
`set_served_version`, ``attnconv serve`` or ``attnconv export --serve`` moves it).
"""

from keras_attnconv.export.exporter import (
    export_model,
    export_registered,
    paper_configurations,
    served_version,
    set_served_version,
)
from keras_attnconv.export.root import (
    DEFAULT_EXPORT_DIRS,
    FORMATS,
    MODELS_CONFIG,
    ExportRoot,
    check_serving_name,
    check_version,
)
from keras_attnconv.export.runtimes import RUNTIMES, load_in_runtime

__all__ = [
    "DEFAULT_EXPORT_DIRS",
    "FORMATS",
    "MODELS_CONFIG",
    "RUNTIMES",
    "ExportRoot",
    "check_serving_name",
    "check_version",
    "export_model",
    "export_registered",
    "load_in_runtime",
    "paper_configurations",
    "served_version",
    "set_served_version",
]
