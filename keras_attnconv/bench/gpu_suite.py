"""The GPU suite of `attnconv bench --suite gpu`: training steps of the paper's models on an accelerator.

For each model and precision (float32, mixed_bfloat16, mixed_float16 with
loss scaling), in a fresh worker process of its own:

- compile time: the first training step;
- ms per training step, waiting for the device after every step (a
  `train_on_batch` returns the loss to the host): the median of `steps`
  steps after `warmup_steps`;
- images/s through `model.fit` on in-memory arrays: one warm-up epoch, then
  one timed epoch of `fit_images` images;
- peak device memory (the allocator's peak; a process peak resident set on
  a CPU);
- achieved TFLOP/s (the forward FLOPs of `attnconv list` on the path taken,
  times 3 for forward + backward) and its fraction of a large matmul in the
  compute dtype, timed by its own worker in the same run.

The quadratic model runs on each of its attention paths (the separable row
and column passes and the dense position contraction), so that the
per-platform rule of `keras_attnconv.layers.path_rule` can be checked
against the same run; `auto_path` says which one the rule picks here.

Runs without TensorFlow (`KERAS_BACKEND=jax`), the way the GPU machine has it.
"""

import json

import keras
import numpy as np
from keras import ops

from keras_attnconv.analysis.throughput import Throughput
from keras_attnconv.bench.measure import device_peak_memory, interleaved, matmul_step, random_images, run_in_workers
from keras_attnconv.models import build_model, count_flops, with_attention_options
from keras_attnconv.models.precision import PRECISIONS
from keras_attnconv.utils.reports import device_description, report_paths, write_report

GPU_FULL = {"models": ("quadratic", "gaussian", "learned", "learned_content", "resnet18"),
            "precisions": PRECISIONS, "paths_of": "quadratic",
            "batch": 100, "image_size": 32, "warmup_steps": 5, "steps": 20, "fit_images": 5000, "matmul": 8192}
# Tiny shapes, a smoke test of every measurement (it runs in the CPU test suite): not a benchmark.
GPU_QUICK = {"models": ("quadratic_tiny", "resnet_tiny"), "precisions": ("mixed_float16",),
             "paths_of": "quadratic_tiny", "batch": 4, "image_size": 8, "warmup_steps": 1, "steps": 3,
             "fit_images": 8, "matmul": 128}
PATHS = {"separable": True, "position": False}  # the quadratic model's paths, as the layer's `separable` forces them


def _attention_path(model):
    """The path of the model's first attention layer on this device, or None for a model without attention."""
    for layer in model.layers:
        if hasattr(layer, "attention"):
            return layer.attention.attention_mode
    return None


def _build(model, precision, image_size, forced_path=None):
    built = build_model(model, seed=0, dtype=precision, image_size=image_size)
    auto_path = _attention_path(built)
    if forced_path is not None:
        built = with_attention_options(built, separable=PATHS[forced_path])
    built.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    return built, auto_path


def measure_case(model, precision, batch, image_size, warmup_steps, steps, fit_images, forced_path=None, **_):
    """One model in one precision (on one forced attention path): times, throughput, memory. A worker's job."""
    keras.utils.set_random_seed(0)
    built, auto_path = _build(model, precision, image_size, forced_path)
    x = ops.convert_to_tensor(random_images(batch, image_size))
    y = ops.convert_to_tensor((np.arange(batch) % 10).astype("int32"))

    def step():
        # The returned loss is a host float: the step has finished on the device.
        losses.append(built.train_on_batch(x, y))

    losses = []
    seconds, compile_seconds = interleaved({"step": step}, steps, warmup=warmup_steps)
    step_seconds = seconds["step"]

    images = random_images(fit_images, image_size, seed=1)
    labels = (np.arange(fit_images) % 10).astype("int32")
    # The epoch's end waits for the device (its logs are read on the host); the first epoch is the warm-up.
    throughput = Throughput(fit_images)
    built.fit(images, labels, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=[throughput])
    peak_mib, memory_source = device_peak_memory()
    flops_per_step = 3 * count_flops(built).total * batch  # forward + backward ~ 3x the forward pass
    return {
        "model": model, "precision": precision, "forced_path": forced_path, "path": _attention_path(built),
        "auto_path": auto_path,
        "batch": batch, "compile_seconds": compile_seconds["step"], "step_ms": 1e3 * step_seconds,
        "steps_timed": steps,
        "fit_images_per_second": throughput.images_per_second, "fit_images": fit_images,
        "peak_memory_mib": peak_mib, "memory_source": memory_source,
        "achieved_tflops": flops_per_step / step_seconds / 1e12, "finite_loss": bool(np.isfinite(losses).all()),
    }


def measure_references(matmul, repeats=10, **_):
    """The device, versions, and the rate of an n x n matmul in each compute dtype. A worker's job."""
    dtypes = ("float32", "bfloat16", "float16")
    seconds, _ = interleaved({dtype: matmul_step(matmul, dtype) for dtype in dtypes}, repeats)
    rates = {dtype: 2 * matmul**3 / seconds[dtype] / 1e12 for dtype in dtypes}
    return {"device": device_description(), "matmul_tflops": rates}


def cases(settings):
    """One case per (precision, model, path): the quadratic model on each of its paths, the others on theirs."""
    found = []
    for precision in settings["precisions"]:
        for model in settings["models"]:
            paths = list(PATHS) if model == settings["paths_of"] else [None]
            found += [{**settings, "model": model, "precision": precision, "forced_path": path} for path in paths]
    return found


def _case_key(case):
    """What a case is (a row of the results carries the same fields as the case it measured)."""
    return case["model"], case["precision"], case["forced_path"]


def _previous_results(output, settings):
    """The results already in `output` from a run with the same settings (to go on from), else None."""
    try:
        with open(report_paths(output)[0]) as f:
            previous = json.load(f)
    except (OSError, ValueError):
        return None
    return previous if previous.get("settings") == settings else None


def run_gpu_benchmark(quick=False, output="bench-gpu.json", command=None, **overrides):
    """Runs the GPU suite (one worker per case, one at a time); writes JSON and a markdown table beside it.

    The results are written after every case, and a run goes on from the
    cases already in `output` when their settings are the same: the same
    command run again after a time limit or a crash finishes the table
    instead of starting over. The reference matmul rates are the first
    invocation's, measured on the same device.
    """
    settings = {k: list(v) if isinstance(v, tuple) else v
                for k, v in {**(GPU_QUICK if quick else GPU_FULL), **overrides}.items()}
    results = _previous_results(output, settings)
    if results is None:
        references = run_in_workers("gpu-references", [settings], concurrently=False)[0]
        results = {"command": command, "device": references["device"],
                   "matmul_tflops": references["matmul_tflops"], "settings": settings, "rows": []}
    done = {_case_key(row) for row in results["rows"]}
    for case in cases(settings):
        if _case_key(case) in done:
            continue
        row = run_in_workers("gpu-case", [case], concurrently=False)[0]
        compute_dtype = keras.DTypePolicy(row["precision"]).compute_dtype
        row["fraction_of_matmul"] = row["achieved_tflops"] / results["matmul_tflops"][compute_dtype]
        results["rows"].append(row)
        _write(results, output)
    _write(results, output)
    return results


def _write(results, output):
    write_report(output, results, gpu_markdown(results))


def gpu_markdown(results):
    device, settings, rates = results["device"], results["settings"], results["matmul_tflops"]
    versions = ", ".join(f"{name} {device[name]}" for name in ("keras", "jax", "jaxlib", "tensorflow", "python")
                         if name in device)
    lines = [
        f"Device: {device['device']}; backend {device['backend']}; {versions}.",
        f"Command: `{results['command']}`" if results.get("command") else None,
        f"Batch {settings['batch']}, {settings['image_size']}x{settings['image_size']}x3 inputs, XLA. Step: median "
        f"of {settings['steps']} training steps after {settings['warmup_steps']}, each waited for. Fit: "
        f"{settings['fit_images']} images after a warm-up epoch. Reference matmul "
        f"{settings['matmul']}x{settings['matmul']}: " + ", ".join(f"{d} {r:.3g}" for d, r in rates.items())
        + " TFLOP/s.",
        "",
        "| model | path | precision | compile s | step ms | fit images/s | peak MiB | TFLOP/s | of matmul |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        path = row["path"] or "-"
        if row["path"] is not None and row["path"] == row["auto_path"]:
            path += " (auto)"
        lines.append(f"| `{row['model']}` | {path} | {row['precision']} | {row['compile_seconds']:.1f} "
                     f"| {row['step_ms']:.2f} | {row['fit_images_per_second']:.0f} | {row['peak_memory_mib']:.0f} "
                     f"| {row['achieved_tflops']:.3g} | {100 * row['fraction_of_matmul']:.0f}% |")
    memory = {row["memory_source"] for row in results["rows"]}
    lines += ["", f"Peak memory: {', '.join(sorted(memory))}."]
    return "\n".join(line for line in lines if line is not None)
