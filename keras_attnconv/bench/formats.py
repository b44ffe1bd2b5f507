"""Inference in each runtime a model is exported to, beside Keras, on this machine (`attnconv bench`, part (e)).

For each model: Keras (``predict_on_batch``, XLA-compiled), its SavedModel in
TensorFlow, its ONNX file in onnxruntime and its LiteRT file in the
ai-edge-litert interpreter (all threads of the machine), fed the same uint8
images: batch-1 latency and batch-64 throughput, timed in turns
(`measure.interleaved`), and each runtime's largest difference from Keras'
probabilities.

Needs the TensorFlow backend (every format is traced by TensorFlow) and the
``export`` extra (tf2onnx, onnxruntime, ai-edge-litert); without them the
section says why it is empty.
"""

import tempfile

import keras
import numpy as np

from keras_attnconv.bench.measure import interleaved, random_images
from keras_attnconv.utils.reports import json_settings, machine, write_report

RUNTIMES = ("keras", "saved_model", "onnx", "litert")
SMALL_BATCH, LARGE_BATCH = 1, 64
FORMATS_FULL = {"format_models": ("quadratic", "learned_content_local", "resnet18"), "repeats": 5}
FORMATS_QUICK = {"format_models": ("quadratic_tiny",), "repeats": 2}


def _softmax(logits):
    logits = np.asarray(logits, "float64")
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def _keras(model, _):
    model.compile(jit_compile=True)
    return lambda x: _softmax(model.predict_on_batch(x))


def _exported(format):
    """The loader of an export in its runtime (the one the export itself is checked with), giving probabilities."""

    def load(_, path):
        from keras_attnconv.export.runtimes import load_in_runtime

        run = load_in_runtime(format, path)
        return run if format == "saved_model" else lambda x: _softmax(run(x))  # ONNX and LiteRT give logits

    return load


_LOADERS = {"keras": _keras, **{format: _exported(format) for format in RUNTIMES[1:]}}


def unavailable():
    """Why the format benchmark cannot run here (a sentence), or None."""
    if keras.backend.backend() != "tensorflow":
        return f"needs the TensorFlow backend; Keras runs on {keras.backend.backend()!r}"
    for module in ("tf2onnx", "onnxruntime", "ai_edge_litert"):
        try:
            __import__(module)
        except ImportError:
            return f"needs {module}: pip install 'keras-attnconv[export]'"
    return None


def format_benchmark(format_models, repeats, **_):
    """Rows of (e): one per model and runtime; a dict with the reason where it cannot run."""
    from keras_attnconv.export.exporter import export_model
    from keras_attnconv.models import build_model

    reason = unavailable()
    if reason is not None:
        return {"skipped": reason}
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnconv-bench-formats-") as root:
        for name in format_models:
            model = build_model(name, seed=0, dtype="float32")
            paths = {fmt: export_model(model, f"{root}/{fmt}", format=fmt, warmup=False)
                     for fmt in ("saved_model", "onnx", "litert")}
            runs = {runtime: _LOADERS[runtime](model, paths.get(runtime)) for runtime in RUNTIMES}
            small, large = (random_images(batch, model.config.image_size, seed=batch)
                            for batch in (SMALL_BATCH, LARGE_BATCH))
            expected = runs["keras"](large)
            seconds = {}
            for batch, images in ((SMALL_BATCH, small), (LARGE_BATCH, large)):
                timed, _ = interleaved({runtime: (lambda run=run, x=images: run(x)) for runtime, run in runs.items()},
                                       repeats, warmup=1)
                seconds[batch] = timed
            for runtime, run in runs.items():
                rows.append({"model": name, "runtime": runtime,
                             "batch1_ms": 1e3 * seconds[SMALL_BATCH][runtime],
                             "batch64_images_per_second": LARGE_BATCH / seconds[LARGE_BATCH][runtime],
                             "max_abs_difference": float(np.abs(run(large) - expected).max())})
    return rows


def formats_markdown(rows, repeats):
    """The rows of `format_benchmark` as a markdown table (or the reason it is empty)."""
    if isinstance(rows, dict):
        return f"Inference in each export format: not measured ({rows['skipped']})."
    lines = [f"Inference in each export format (uint8 images in, probabilities out; medians of {repeats} rounds "
             "in turns; difference: largest absolute difference from Keras' probabilities on the batch of 64):", "",
             "| model | runtime | batch 1 ms | batch 64 images/s | vs Keras batch 64 | max abs diff |",
             "|---|---|---|---|---|---|"]
    keras_rate = {row["model"]: row["batch64_images_per_second"] for row in rows if row["runtime"] == "keras"}
    for row in rows:
        lines.append(f"| `{row['model']}` | {row['runtime']} | {row['batch1_ms']:.1f} "
                     f"| {row['batch64_images_per_second']:.1f} "
                     f"| {row['batch64_images_per_second'] / keras_rate[row['model']]:.2f}x "
                     f"| {row['max_abs_difference']:.1e} |")
    return "\n".join(lines)


def run_format_benchmark(quick=False, output="bench-formats.json", **overrides):
    """Runs (e) alone (``attnconv bench --suite formats``); writes JSON and a markdown table beside; returns them."""
    settings = {**(FORMATS_QUICK if quick else FORMATS_FULL), **overrides}
    results = {"machine": machine(),
               "settings": json_settings(settings),
               "formats": format_benchmark(**settings)}
    write_report(output, results, formats_markdown(results["formats"], settings["repeats"]))
    return results
