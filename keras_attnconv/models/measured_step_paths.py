"""The training step's path measured on this machine: what `attnconv bench --suite steps` found faster, per model.

On a CPU the faster of XLA and TensorFlow's graph depends on the model, not
only on what the CPU can do: on an AMD EPYC with AVX-512 BF16, in float32,
the graph was faster for `quadratic` and XLA for `learned`, two models of the
same size (docs/performance.md). No rule of the device alone picks right for
both, so the steps suite records each model's faster path on the machine it
ran on, and ``jit_compile="auto"`` takes that record where one exists
(`step_compilation.resolve_jit_compile_for`), the rule elsewhere.

A record is keyed by what the timings depend on: the CPU (model, bfloat16 and
vector units, usable cores), the Keras backend and versions, the model's
class and architecture (its config without its name and preprocessing), and
the precision. It lives in the package's cache directory
(`keras_attnconv.utils.files.cache_directory`), one JSON file, written
atomically under a lock; an unreadable file is treated as no record.
"""

import datetime
import hashlib
import json

import keras

from keras_attnconv.utils.files import cache_directory, file_lock, read_json, write_json
from keras_attnconv.utils.reports import cpu_capabilities, usable_cpus

FORMAT = 1
#: Config fields that do not change the step's computation (names, preprocessing): not part of a record's key.
UNTIMED_FIELDS = ("name", "trainable", "dtype", "class_names", "pixel_mean", "pixel_std")


def records_path():
    """The JSON file of this machine's measured step paths."""
    return cache_directory("step_paths") / "step_paths.json"


def _machine():
    import platform

    cpu = cpu_capabilities()
    versions = {"keras": keras.__version__, "backend": keras.backend.backend()}
    if versions["backend"] == "tensorflow":
        import tensorflow as tf

        versions["tensorflow"] = tf.__version__
    return {
        "cpu": cpu["model"],
        "flags": sorted(cpu["flags"]),
        "cpus": usable_cpus(),
        "machine": platform.machine(),
        **versions,
    }


def record_key(model, precision):
    """The key of `model`'s record in `precision` on this machine (a hex digest)."""
    architecture = {k: v for k, v in model.get_config().items() if k not in UNTIMED_FIELDS}
    identity = {
        "format": FORMAT,
        "machine": _machine(),
        "class": type(model).__name__,
        "config": architecture,
        "precision": keras.DTypePolicy(precision).name,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _records():
    try:
        records = read_json(records_path())
    except (OSError, ValueError):  # no file yet, or one this version cannot read: no record
        return {}
    return records.get("records", {}) if isinstance(records, dict) and records.get("format") == FORMAT else {}


def measured_jit_compile(model, precision):
    """True (XLA) or False (the graph), as measured faster here for `model` in `precision`; None: unmeasured."""
    record = _records().get(record_key(model, precision))
    return record["jit_compile"] if isinstance(record, dict) and isinstance(record.get("jit_compile"), bool) else None


def record_measured_jit_compile(model, precision, step_seconds):
    """Records the faster of ``step_seconds`` (``{True: XLA seconds, False: graph seconds}``) for `model`."""
    faster = min(step_seconds, key=step_seconds.get)
    path = records_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.with_name(path.name + ".lock")):
        records = _records()
        records[record_key(model, precision)] = {
            "jit_compile": faster,
            "model": model.name,
            "precision": keras.DTypePolicy(precision).name,
            "step_ms": {("xla" if jit else "graph"): 1e3 * seconds for jit, seconds in step_seconds.items()},
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        write_json(path, {"format": FORMAT, "records": records})
    return faster
