"""`export_model`: one model of the zoo, checked in its runtime, published as a new version of an export root."""

import errno
import json
import shutil

from keras_attnconv.export.formats import (
    COMPUTE_DTYPES,
    require_tensorflow_backend,
    serving_copy,
    write_saved_model,
    write_single_file,
)
from keras_attnconv.export.root import METADATA_FILES, ExportRoot, check_serving_name, check_version
from keras_attnconv.export.runtimes import check_in_runtime
from keras_attnconv.models.presets import check_zoo_model, model_metadata
from keras_attnconv.utils.checks import check_bool, check_choice
from keras_attnconv.utils.files import is_full_disk


def export_model(
    model,
    export_dir=None,
    *,
    format="saved_model",
    version=None,
    serving_name=None,
    serve=False,
    jit_compile=False,
    compute_dtype="float32",
    metadata=None,
    warmup=True,
    base_path="/models",
):
    """Exports a model of the zoo as ``export_dir/<name>/<version>/``; returns the version directory.

    Args:
        model: an `AttentionClassifier` or `ResNet` (`build_model`,
            `from_preset`): it knows its input size, normalisation and class
            names. Exported computing in `compute_dtype` whatever its dtype policy.
        export_dir: export root (default: `DEFAULT_EXPORT_DIRS` of the format).
        format: ``"saved_model"`` (TF Serving), ``"onnx"`` or ``"litert"``.
        version: int or None (next free version, also when concurrent
            exports of the same model race). An existing version is never
            overwritten: FileExistsError.
        serving_name: the directory (and TF Serving model) name, default
            ``model.name``; a plain name, recorded beside the model's own.
        serve: SavedModel only: make this version the one ``models.config``
            serves (otherwise the served version stays as it was; a new model
            serves its first version). Refused where a version label of the
            model's entry names another version (TF Serving refuses a label
            on a version it does not serve).
        jit_compile: SavedModel only: an XLA-compiled serving function
            instead of a plain graph.
        compute_dtype: ``"float32"``, or SavedModel only ``"bfloat16"``: the
            matmuls in bfloat16 (the ``mixed_bfloat16`` policy: weights,
            scores, softmax and outputs stay float32, and so does the
            signature). It pays only on a CPU with bfloat16 units
            (docs/export.md has the measurements).
        metadata: extra JSON-serializable fields for ``metadata.json``.
        warmup: SavedModel only: write ``assets.extra/tf_serving_warmup_requests``.
        base_path: where TF Serving finds `export_dir` (``models.config``'s base paths).

    Raises:
        ValueError: a model not of the zoo, a bad name, format or version,
            an export root whose model directory holds another format, or
            a ``models.config`` there that is not TF Serving's, or whose
            entry of this name serves a folder other than this root's (the
            user's, never changed).
        PermissionError, NotADirectoryError: `export_dir` cannot be written.
        All are raised before any work; nothing is written.
        RuntimeError: the exported file cannot be loaded, or run on one
            batch, by its runtime (checked where it is installed); nothing
            is published.
        OSError: ``errno.ENOSPC`` where the export root's device fills up
            during the export, naming the root; nothing is published.
    """
    check_zoo_model(model)
    root = ExportRoot(export_dir, format)
    name = check_serving_name(serving_name) if serving_name is not None else check_serving_name(model.name, "name")
    for flag, value in (("serve", serve), ("jit_compile", jit_compile), ("warmup", warmup)):
        check_bool(flag, value)
    check_choice("compute_dtype", compute_dtype, tuple(COMPUTE_DTYPES))
    if format != "saved_model" and (serve or jit_compile or compute_dtype != "float32"):
        raise ValueError(
            f"`serve`, `jit_compile` and a `compute_dtype` other than float32 apply to SavedModels only. "
            f"Received: format={format!r}, serve={serve}, jit_compile={jit_compile}, "
            f"compute_dtype={compute_dtype!r}"
        )
    require_tensorflow_backend()
    root.check(name, base_path)
    if serve:
        root.check_serve(name, version, base_path)
    root.check_new_version(name, version)  # fail before the work; rechecked at publication
    root.check_same_answers(name, model.preprocessing)
    json.dumps(metadata, allow_nan=False)  # not JSON (a type, a NaN): an error before the work

    exported = serving_copy(model, compute_dtype)
    root.claim()
    staging = root.new_staging(name)
    info = {
        **(metadata or {}),
        **model_metadata(exported),
        "config": exported.get_config(),
        "serving_name": name,
        "format": format,
        "compute_dtype": compute_dtype,
        "version": None,
    }

    def write_metadata(directory, number):
        info["version"] = number
        (directory / METADATA_FILES[format]).write_text(json.dumps(info, indent=2, allow_nan=False) + "\n")

    try:
        if format == "saved_model":
            info["signature"] = write_saved_model(exported, staging, name, jit_compile, warmup)
            info["jit_compile"] = jit_compile
        else:
            info["signature"] = write_single_file(
                exported,
                staging,
                format,
                {"model": exported.name, "serving_name": name, "preprocessing": exported.preprocessing},
            )
        check_in_runtime(exported, staging, format, name)
        target = root.publish(staging, name, version, write_metadata)
    except Exception as error:
        if not is_full_disk(error):
            raise
        # TensorFlow's own message names its temporary file and op; the user needs the root and what to do.
        raise OSError(
            errno.ENOSPC,
            f"No space left on the device of the export root for {name!r}: nothing was published. Free some space "
            f"and export again. Received: export_dir={str(root.path)!r}",
        ) from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if format == "saved_model":
        root.update_models_config(base_path=base_path, serve={name: int(target.name)} if serve else None)
    return target


def served_version(export_dir, name):
    """The version of `name` that ``models.config`` under `export_dir` serves (None if it lists no such model)."""
    return ExportRoot(export_dir).served_version(name)


def set_served_version(export_dir, name, version, base_path="/models"):
    """Makes ``models.config`` serve `version` of the SavedModel `name` under `export_dir`; returns its path.

    Every other entry and field of ``models.config`` stays as it was. An entry
    of `name` serving a folder other than this root's, or with a version label
    on another version, is an error naming it (`ExportRoot.check_serve`).
    """
    root = ExportRoot(export_dir)
    check_serving_name(name, "name")
    check_version(version, allow_none=False)
    root.check()
    root.check_serve(name, version, base_path)
    return root.update_models_config(base_path=base_path, serve={name: version})


def paper_configurations():
    """Registered full-size names: the paper's rows, the follow-ups and baselines (not the small variants)."""
    from keras_attnconv.models import get_paper_figures, list_models

    return [name for name in list_models() if get_paper_figures(name).source != "ours"]


def export_registered(name, export_dir=None, **kwargs):
    """Exports the registered configuration `name` with its initial (untrained) weights; see `export_model`."""
    from keras_attnconv.models import build_model, get_model_config

    get_model_config(name)  # an unknown name fails here, before any work
    ExportRoot(export_dir, kwargs.get("format", "saved_model")).check()
    metadata = {
        "weights": "initial (untrained): built by build_model, not trained",
        **(kwargs.pop("metadata", None) or {}),
    }
    return export_model(build_model(name, dtype="float32"), export_dir, metadata=metadata, **kwargs)
