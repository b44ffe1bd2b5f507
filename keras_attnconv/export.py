"""SavedModel export for TF Serving: ``saved_models/<model>/<version>/``.

The serving signature (``serving_default``) takes ``images``: uint8
``[batch, H, W, 3]`` and returns ``probabilities`` (float32 ``[batch, classes]``),
``classes`` (int64 ``[batch]``) and ``class_names`` (string ``[batch]``). The
per-channel normalisation is inside the graph, so clients send raw pixels.

Each version directory is written under a hidden staging name
(``.tmp-<random>-<host>-<pid>``) and renamed onto its number at the end, so TF
Serving never sees half an export. The rename is also how a version number is
claimed: concurrent exports of one model end on distinct versions, and an
existing version is never overwritten. Staging directories left by killed
exports are removed by the next export. ``saved_models/models.config`` lists
every exported model for ``--model_config_file``; ``assets.extra/`` holds the
warm-up requests TF Serving replays at load time and ``metadata.json``.
"""

import errno
import json
import os
import re
import secrets
import shutil
import socket
import time
from pathlib import Path

import keras
import numpy as np

from keras_attnconv.data import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD
from keras_attnconv.utils import write_atomically
from keras_attnconv.version import __version__

WARMUP_FILE = "tf_serving_warmup_requests"
WARMUP_BATCH_SIZES = (1, 8)
# Staging directories whose owner cannot be checked (another host, another naming) are
# removed only after this long: no export takes a day.
STALE_STAGING_SECONDS = 24 * 3600
STAGING_NAME = re.compile(r"\.tmp-[0-9a-f]+-(?P<host>.+)-(?P<pid>\d+)")


def float32_copy(model, model_config=None):
    """The model to serve: a registered model rebuilt in float32 with `model`'s weights.

    Args:
        model: a Keras model.
        model_config: the registry config `model` was built from
            (``get_model_config(name, **overrides)``; a training run's
            ``config.json`` holds the name and the overrides), or None.

    Returns:
        With `model_config`, ``model_config.build(dtype="float32")`` (what
        ``build_model(name, dtype="float32", **overrides)`` builds) holding
        `model`'s weights: whatever precision `model` trained in, the copy
        computes in float32. Without it (a model of your own), `model` itself:
        it is served in its own dtype policies, with float32 outputs all the
        same; build it in float32 and give it the weights to serve float32.
    """
    if model_config is None:
        return model
    copy = model_config.build(name=model.name, dtype="float32")
    copy.set_weights(model.get_weights())
    return copy


def next_version(model_dir):
    """1 + the largest numeric version under `model_dir` (1 if none)."""
    versions = [int(p.name) for p in Path(model_dir).glob("*") if p.is_dir() and p.name.isdigit()]
    return max(versions, default=0) + 1


def _served_models(export_root):
    return sorted(p.name for p in export_root.iterdir()
                  if p.is_dir() and any(v.is_dir() and v.name.isdigit() for v in p.iterdir()))


def write_models_config(export_root, base_path="/models"):
    """Writes ``models.config`` (TF Serving text proto) listing every model under `export_root`."""
    export_root = Path(export_root)
    path = export_root / "models.config"
    while True:
        names = _served_models(export_root)
        entries = "".join(
            f'  config {{\n    name: "{name}"\n    base_path: "{base_path}/{name}"\n'
            f'    model_platform: "tensorflow"\n    model_version_policy {{ all {{}} }}\n  }}\n'
            for name in names
        )
        write_atomically(path, lambda tmp: tmp.write_text(f"model_config_list {{\n{entries}}}\n"))
        # A concurrent export may publish another model after our scan and write its config
        # before ours lands: whoever sees the listing change after writing writes again, so
        # the last write always lists every model (no lock needed).
        if _served_models(export_root) == names:
            return path


def require_tensorflow_backend():
    """Raises RuntimeError unless Keras runs on TensorFlow: a SavedModel is traced by TensorFlow."""
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(f"Export writes a TensorFlow SavedModel and needs the TensorFlow backend; Keras runs on "
                           f"{keras.backend.backend()!r}. Run it as KERAS_BACKEND=tensorflow attnconv export ...")


def _check_writable(export_dir, *subdirs):
    """Fails before any work if a version or ``models.config`` could not be written."""
    for path in (Path(export_dir), *subdirs):
        # The directory is created if missing: then its nearest existing parent must be writable.
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir():
            raise NotADirectoryError(f"Cannot export to export_dir={str(export_dir)!r}: "
                                     f"{existing} is a file, not a directory.")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise PermissionError(f"Cannot export to export_dir={str(export_dir)!r}: "
                                  f"{existing} is not writable.")


def _pid_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _remove_stale_staging(model_dir):
    """Removes the staging directories of exports that were killed; never a running export's."""
    for staging in model_dir.glob(".tmp-*"):
        match = STAGING_NAME.fullmatch(staging.name)
        try:
            # A pid only identifies a process on this host (the export root may be shared
            # storage), and os.kill(pid, 0) would terminate it on Windows.
            if match and match["host"] == socket.gethostname() and os.name == "posix":
                stale = not _pid_alive(int(match["pid"]))
            else:
                stale = time.time() - staging.stat().st_mtime > STALE_STAGING_SECONDS
        except FileNotFoundError:  # removed meanwhile by another export
            continue
        if stale:
            shutil.rmtree(staging, ignore_errors=True)


def _version_exists(target, version):
    return FileExistsError(f"{target} exists: versions are never overwritten. Pass another `version`, "
                           f"or version=None for the next free one. Received: version={version}")


def _publish(staging, model_dir, version, info):
    """Renames the complete `staging` directory onto its version number; returns the version directory.

    The rename is the atomic claim of the number: when two exports pick the
    same next version, the second rename fails (the first one's directory is
    not empty) and, with ``version=None``, moves on to the next number.
    """
    candidate = next_version(model_dir) if version is None else version
    while True:
        target = model_dir / str(candidate)
        info["version"] = candidate  # metadata.json names the version, so it is written per try
        (staging / "assets.extra" / "metadata.json").write_text(json.dumps(info, indent=2) + "\n")
        try:
            os.rename(staging, target)  # atomic: TF Serving sees all of the version or none of it
            return target
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                raise
            if version is not None:
                raise _version_exists(target, version) from None
            candidate += 1


def _serving_function(model, class_names, mean, std):
    import tensorflow as tf

    mean = tf.constant(mean, tf.float32)
    std = tf.constant(std, tf.float32)
    names = tf.constant(list(class_names), tf.string)

    def serve(images):
        pixels = (tf.cast(images, tf.float32) / 255.0 - mean) / std
        logits = tf.cast(model(pixels, training=False), tf.float32)
        probabilities = tf.nn.softmax(logits, axis=-1)
        classes = tf.argmax(probabilities, axis=-1, output_type=tf.int64)
        return {"probabilities": probabilities, "classes": classes, "class_names": tf.gather(names, classes)}

    return serve


def _write_warmup(version_dir, model_name, image_shape):
    """TF Serving warm-up records (PredictionLog protos) built with tensorflow-serving-api."""
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    path = version_dir / "assets.extra" / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for batch in WARMUP_BATCH_SIZES:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name="serving_default"))
            images = rng.integers(0, 256, (batch, *image_shape), dtype=np.uint8)
            request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path


def export_saved_model(model, export_dir, *, version=None, class_names=None, jit_compile=False,
                       model_name=None, mean=CIFAR10_MEAN, std=CIFAR10_STD, metadata=None, warmup=True,
                       model_config=None):
    """Exports `model` for TF Serving as ``export_dir/<model_name>/<version>/``.

    Args:
        model: a Keras model from images (normalised float) to logits.
        export_dir: export root (``saved_models``); ``models.config`` is
            rewritten there.
        version: int or None (next free version, also when concurrent
            exports of the same model race). An existing version is never
            overwritten: FileExistsError.
        class_names: names of the classes (default: CIFAR-10's when the model
            has 10 outputs, else the class indices).
        jit_compile: export an XLA-compiled serving function instead of a
            plain graph.
        model_name: directory name (default: ``model.name``).
        mean, std: per-channel normalisation applied inside the graph.
        metadata: extra JSON-serializable fields for ``metadata.json``.
        warmup: write ``assets.extra/tf_serving_warmup_requests`` (built with
            tensorflow-serving-api).
        model_config: the registry config `model` was built from, or None:
            see `float32_copy`. With it, a model trained in mixed precision
            is served as its float32 rebuild; without it, `model` is served
            as it is.

    Returns:
        The path of the version directory.

    Raises:
        PermissionError, NotADirectoryError: `export_dir` cannot be written;
            raised before any work, nothing is written.
    """
    import tensorflow as tf

    model_name = model_name or model.name
    num_classes = int(model.output_shape[-1])
    if class_names is None:
        class_names = CIFAR10_CLASSES if num_classes == 10 else [str(i) for i in range(num_classes)]
    if len(class_names) != num_classes:
        raise ValueError(f"`class_names` must have one name per output ({num_classes}). "
                         f"Received: {len(class_names)} names")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise ValueError(f"`version` must be a positive integer or None. Received: version={version!r}")
    model_dir = Path(export_dir) / model_name
    require_tensorflow_backend()
    _check_writable(export_dir, model_dir)
    if version is not None and (model_dir / str(version)).exists():
        raise _version_exists(model_dir / str(version), version)  # fail before the work; rechecked at publication

    serving_model = float32_copy(model, model_config)
    image_shape = tuple(int(d) for d in serving_model.input_shape[1:])
    model_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(model_dir)
    # Unique per export (random part) and traceable to its process (host, pid) for the cleanup.
    staging = model_dir / f".tmp-{secrets.token_hex(4)}-{socket.gethostname()}-{os.getpid()}"
    try:
        archive = keras.export.ExportArchive()
        archive.track(serving_model)
        archive.add_endpoint(
            "serving_default",
            _serving_function(serving_model, class_names, mean, std),
            input_signature=[tf.TensorSpec((None, *image_shape), tf.uint8, name="images")],
            jit_compile=jit_compile,
        )
        archive.write_out(str(staging), verbose=False)
        if warmup:
            _write_warmup(staging, model_name, image_shape)
        info = {
            "model": model_name,
            "version": None,  # set by _publish
            "signature": {"inputs": {"images": ["uint8", [None, *image_shape]]},
                          "outputs": {"probabilities": ["float32", [None, num_classes]],
                                      "classes": ["int64", [None]], "class_names": ["string", [None]]}},
            "class_names": list(class_names),
            "normalization": {"mean": list(mean), "std": list(std)},
            "trainable_parameters": int(sum(np.prod(w.shape) for w in serving_model.trainable_weights)),
            "jit_compile": jit_compile,
            "keras_attnconv_version": __version__,
            **(metadata or {}),
        }
        (staging / "assets.extra").mkdir(exist_ok=True)
        target = _publish(staging, model_dir, version, info)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    write_models_config(export_dir)
    return target


def paper_configurations():
    """Registered full-size names: the paper's rows, the follow-ups and baselines (not the small variants)."""
    from keras_attnconv.models import get_paper_figures, list_models

    return [name for name in list_models() if get_paper_figures(name).source != "ours"]


def export_registered(name=None, export_dir="saved_models", *, run_dir=None, version=None, jit_compile=False):
    """Exports a registered model with initial weights, or a training run's best checkpoint.

    Args:
        name: a registered model name; with `run_dir`, defaults to the run's model.
        export_dir: export root.
        run_dir: a `attnconv train` run directory; its ``checkpoints/best.keras``
            is exported and its metrics go into the metadata.
        version, jit_compile: see `export_saved_model`.
    """
    import dataclasses

    from keras_attnconv.data import dataset_info
    from keras_attnconv.models import build_model, get_model_config

    require_tensorflow_backend()
    _check_writable(export_dir)  # before building or loading the model
    if run_dir is None:
        if name is None:
            raise ValueError("Give a model name or a training run directory.")
        # Built in float32 whatever Keras' global policy, so it is served as it is: no rebuild (model_config).
        model, model_config = build_model(name, dtype="float32"), None
        metadata = {"weights": "initial (untrained): built by build_model, not trained",
                    "model_config": dataclasses.asdict(get_model_config(name))}
        info = dataset_info("cifar10")
    else:
        run_dir = Path(run_dir)
        config_path, checkpoint = run_dir / "config.json", run_dir / "checkpoints" / "best.keras"
        if not config_path.exists() or not checkpoint.exists():
            raise FileNotFoundError(f"{run_dir} is not a finished training run (needs config.json and "
                                    f"checkpoints/best.keras). Received: run_dir={str(run_dir)!r}")
        config = json.loads(config_path.read_text())
        name = name or config["model"]
        model = keras.saving.load_model(checkpoint, compile=False)
        metrics_path = run_dir / "metrics.json"
        metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
        best = json.loads((run_dir / "checkpoints" / "best.json").read_text())
        metadata = {"weights": "trained: best validation checkpoint", "training_run": str(run_dir.resolve()),
                    "training_config": config, "best_val_accuracy": best.get("val_accuracy"),
                    "best_epoch": best.get("epoch"), "eval_accuracy": metrics.get("eval_accuracy"),
                    "eval_split": metrics.get("eval_split")}
        info = dataset_info(config["dataset"])
        model_args = {"num_classes": info.num_classes, "image_size": info.image_size, **config["model_overrides"]}
        model_config = get_model_config(config["model"], **model_args)  # the float32 rebuild of the trained model
        metadata["model_config"] = dataclasses.asdict(model_config)
    return export_saved_model(model, export_dir, version=version, jit_compile=jit_compile, model_name=name,
                              class_names=info.class_names, mean=info.mean, std=info.std, metadata=metadata,
                              model_config=model_config)
