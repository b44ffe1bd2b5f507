"""Inference in each runtime a model is exported to, beside Keras, on this machine (`attnconv bench`, part (e)).

For each model: Keras (``predict_on_batch``, XLA-compiled), its SavedModel in
TensorFlow (and the same SavedModel computing in bfloat16, `export_model`'s
``compute_dtype``), its ONNX file in onnxruntime and its LiteRT file in the
ai-edge-litert interpreter (all threads of the machine), fed the same real
uint8 images (the package's embedded CIFAR-10 sample): batch-1 latency and
batch-64 throughput, timed in turns (`measure.interleaved`), and each
runtime's largest difference from Keras' float32 probabilities.

The bfloat16 SavedModel is measured where the CPU computes in bfloat16 (AMX,
AVX-512 BF16; `measures_bfloat16_serving`); elsewhere its rows say why not.

Needs the TensorFlow backend (every format is traced by TensorFlow) and the
``export`` extra (tf2onnx, onnxruntime, ai-edge-litert); without them the
section says why it is empty.
"""

import tempfile

import keras
import numpy as np

from keras_attnconv.bench.measure import interleaved
from keras_attnconv.utils.assets import SAMPLE_PATH
from keras_attnconv.utils.reports import cpu_capabilities, json_settings, machine, write_report

# Each runtime but Keras: the `export_model` options of the file it runs.
EXPORTS = {
    "saved_model": {"format": "saved_model"},
    "saved_model_bfloat16": {"format": "saved_model", "compute_dtype": "bfloat16"},
    "onnx": {"format": "onnx"},
    "litert": {"format": "litert"},
}
RUNTIMES = ("keras", *EXPORTS)
SMALL_BATCH, LARGE_BATCH = 1, 64
FORMATS_FULL = {
    "format_models": ("quadratic", "learned_content_local", "resnet18"),
    "repeats": 5,
    "bfloat16_serving": "auto",
}
# The quick suite checks that every row runs, so it measures the bfloat16 SavedModel of its tiny model on any CPU.
FORMATS_QUICK = {"format_models": ("quadratic_tiny",), "repeats": 2, "bfloat16_serving": True}
BFLOAT16_SERVING = "saved_model_bfloat16"


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


_LOADERS = {"keras": _keras, **{runtime: _exported(options["format"]) for runtime, options in EXPORTS.items()}}


def real_images(count):
    """The first `count` validation images of the embedded CIFAR-10 sample (uint8, 32x32x3)."""
    with np.load(SAMPLE_PATH) as sample:
        return sample["x_validation"][:count]


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


def measures_bfloat16_serving(bfloat16_serving, bfloat16_units):
    """Whether the bfloat16 SavedModel is measured: `bfloat16_serving` True or False forces it; ``"auto"``
    measures it where the CPU has `bfloat16_units` (`cpu_capabilities`). Without them TensorFlow runs bfloat16
    einsums on Eigen's element-by-element kernels: `learned_content_local`'s mixed_bfloat16 forward took 14x its
    float32 one's time for one image on an AMD EPYC with AVX2 (docs/performance.md), and its bfloat16 SavedModel
    ran over 20 minutes in the suite without finishing."""
    if bfloat16_serving == "auto":
        return bfloat16_units is not None
    if not isinstance(bfloat16_serving, bool):
        raise ValueError(
            f'`bfloat16_serving` must be true, false or "auto". Received: bfloat16_serving={bfloat16_serving!r}'
        )
    return bfloat16_serving


def check_format_models(format_models):
    """Raises ValueError, before anything is built, for an unknown name (with the closest ones) or a model that
    does not take the embedded sample's images."""
    from keras_attnconv.models import get_model_config

    size = real_images(1).shape[1]
    for name in format_models:
        taken = get_model_config(name).image_size
        if taken != size:
            raise ValueError(
                f"The format benchmark runs the embedded {size}x{size} CIFAR-10 images; {name!r} takes "
                f"{taken}x{taken}. Received: models={tuple(format_models)!r}"
            )


def format_benchmark(format_models, repeats, bfloat16_serving="auto", **_):
    """Rows of (e): one per model (`check_format_models`) and runtime, a runtime left out (the bfloat16
    SavedModel: `measures_bfloat16_serving`) with its reason as ``skipped``; a dict with the reason where
    nothing can run."""
    from keras_attnconv.export.exporter import export_model
    from keras_attnconv.models import build_model

    units = cpu_capabilities()["bfloat16_units"]
    left_out = {}
    if not measures_bfloat16_serving(bfloat16_serving, units):
        left_out[BFLOAT16_SERVING] = (
            "bfloat16_serving is false"
            if units is not None
            else "this CPU has no bfloat16 units (AMX, AVX-512 BF16): TensorFlow would convert each element"
        )
    reason = unavailable()
    if reason is not None:
        return {"skipped": reason}
    exports = {runtime: options for runtime, options in EXPORTS.items() if runtime not in left_out}
    large = real_images(LARGE_BATCH)
    small = large[:SMALL_BATCH]
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnconv-bench-formats-") as root:
        for name in format_models:
            model = build_model(name, seed=0, dtype="float32")
            paths = {
                runtime: export_model(model, f"{root}/{runtime}", warmup=False, **options)
                for runtime, options in exports.items()
            }
            runs = {runtime: _LOADERS[runtime](model, paths.get(runtime)) for runtime in ("keras", *exports)}
            expected = runs["keras"](large)
            seconds = {}
            for batch, images in ((SMALL_BATCH, small), (LARGE_BATCH, large)):
                timed, _ = interleaved(
                    {runtime: (lambda run=run, x=images: run(x)) for runtime, run in runs.items()}, repeats, warmup=1
                )
                seconds[batch] = timed
            for runtime in RUNTIMES:
                if runtime in left_out:
                    rows.append({"model": name, "runtime": runtime, "skipped": left_out[runtime]})
                    continue
                rows.append(
                    {
                        "model": name,
                        "runtime": runtime,
                        "batch1_ms": 1e3 * seconds[SMALL_BATCH][runtime],
                        "batch64_images_per_second": LARGE_BATCH / seconds[LARGE_BATCH][runtime],
                        "max_abs_difference": float(np.abs(runs[runtime](large) - expected).max()),
                    }
                )
    return rows


def formats_markdown(rows, repeats):
    """The rows of `format_benchmark` as a markdown table (or the reason it is empty)."""
    if isinstance(rows, dict):
        return f"Inference in each export format: not measured ({rows['skipped']})."
    lines = [
        f"Inference in each export format (uint8 images in, probabilities out; medians of {repeats} rounds "
        "in turns; saved_model_bfloat16: the SavedModel computing in bfloat16; difference: largest absolute "
        "difference from Keras' float32 probabilities on 64 real images of the embedded sample):",
        "",
        "| model | runtime | batch 1 ms | batch 64 images/s | vs Keras batch 64 | max abs diff |",
        "|---|---|---|---|---|---|",
    ]
    keras_rate = {row["model"]: row["batch64_images_per_second"] for row in rows if row["runtime"] == "keras"}
    for row in rows:
        if "skipped" in row:
            lines.append(f"| `{row['model']}` | {row['runtime']} | not measured: {row['skipped']} | | | |")
            continue
        lines.append(
            f"| `{row['model']}` | {row['runtime']} | {row['batch1_ms']:.1f} "
            f"| {row['batch64_images_per_second']:.1f} "
            f"| {row['batch64_images_per_second'] / keras_rate[row['model']]:.2f}x "
            f"| {row['max_abs_difference']:.1e} |"
        )
    return "\n".join(lines)


def run_format_benchmark(quick=False, output="bench-formats.json", models=None, **overrides):
    """Runs (e) alone (``attnconv bench --suite formats``; `models`: its models instead of the suite's); writes
    JSON and a markdown table beside; returns them."""
    settings = {**(FORMATS_QUICK if quick else FORMATS_FULL), **overrides}
    if models is not None:
        settings["format_models"] = tuple(models)
    check_format_models(settings["format_models"])  # also where the runtimes are missing: a bad name is an error
    results = {"machine": machine(), "settings": json_settings(settings), "formats": format_benchmark(**settings)}
    write_report(output, results, formats_markdown(results["formats"], settings["repeats"]))
    return results
