"""Benchmarks behind `attnconv bench`: everything measured side by side in one run.

(a) the attention layer, forward + backward, separable fast path vs the
    general eq. (8) path, at growing token grids: time ratio, peak memory of
    each (measured in a fresh worker process per case), max abs difference;
(b) training-step throughput of the paper's models against ResNet-18;
(c) each step's achieved GFLOP/s as a fraction of a large matmul's, measured
    in the same run.

Only `keras`, `keras.ops` and NumPy are used, so the benchmark runs on any
backend. Times on a shared machine are noisy: compare the ratios, not the
absolute numbers, and only between rows of the same run.
"""

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers import RelativeMultiHeadAttention
from keras_attnconv.models import build_model
from keras_attnconv.models.flops import count_flops

FULL = {"sizes": (16, 32, 64), "hidden": 400, "heads": 9, "layer_batch": 2, "repeats": 3,
        "models": ("quadratic", "learned", "learned_content", "resnet18"),
        "precisions": ("float32", "mixed_bfloat16"), "model_batch": 16, "matmul": 2048}
QUICK = {"sizes": (8, 16), "hidden": 32, "heads": 9, "layer_batch": 2, "repeats": 3,
         "models": ("quadratic_tiny", "resnet_tiny"), "precisions": ("float32",), "model_batch": 8, "matmul": 512}


def _timed(step, repeats):
    """Median seconds of `step()` after one warm-up call (which compiles); also returns the warm-up time."""
    start = time.perf_counter()
    step()
    compile_seconds = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times), compile_seconds


def _layer_model(size, hidden, heads, separable):
    inputs = keras.Input((size, size, hidden))
    attention = RelativeMultiHeadAttention(heads, position_score="quadratic", separable=separable, name="attention")
    model = keras.Model(inputs, attention(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", jit_compile=True)
    return model


def _memory_kib(field):
    """VmRSS / VmHWM (peak) of this process in KiB, from /proc (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(field)


def _reset_peak_memory():
    """Resets VmHWM to the current RSS (Linux 4.0+); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def layer_case(size, hidden, heads, batch, repeats, separable, seed=0):
    """Forward + backward seconds of one attention layer (a training step with a zero learning rate).

    Peak memory is the rise of the process' resident set during the timed
    steps, after compilation (Linux); elsewhere, during compilation and steps.
    """
    keras.utils.set_random_seed(seed)
    model = _layer_model(size, hidden, heads, separable)
    x = np.random.default_rng(seed).normal(size=(batch, size, size, hidden)).astype("float32")
    y = np.zeros_like(x)
    step = lambda: model.train_on_batch(x, y)  # noqa: E731
    start = time.perf_counter()
    step()
    compile_seconds = time.perf_counter() - start
    if _reset_peak_memory():
        baseline = _memory_kib("VmRSS")
        seconds, _ = _timed(step, repeats)
        peak_kib = _memory_kib("VmHWM") - baseline
    else:
        baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        seconds, _ = _timed(step, repeats)
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline
    return {"seconds": seconds, "compile_seconds": compile_seconds, "peak_memory_mib": peak_kib / 1024,
            "mode": model.get_layer("attention").attention_mode}


def _layer_case_in_worker(**case):
    """Runs `layer_case` in a fresh interpreter, so that its peak memory is its own."""
    command = [sys.executable, "-m", "keras_attnconv.bench", "--worker", json.dumps(case)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"benchmark worker failed for {case}:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _max_difference(size, hidden, heads, seed=0):
    """Max |fast - general| of the layer outputs for the same weights and input (batch 1)."""
    keras.utils.set_random_seed(seed)
    fast = RelativeMultiHeadAttention(heads, position_score="quadratic", separable=True)
    general = RelativeMultiHeadAttention(heads, position_score="quadratic", separable=False)
    x = np.random.default_rng(seed).normal(size=(1, size, size, hidden)).astype("float32")
    fast.build(x.shape)
    general.build(x.shape)
    general.set_weights(fast.get_weights())
    return float(np.abs(ops.convert_to_numpy(fast(x)) - ops.convert_to_numpy(general(x))).max())


def layer_benchmark(sizes, hidden, heads, layer_batch, repeats, **_):
    rows = []
    for size in sizes:
        cases = {separable: _layer_case_in_worker(size=size, hidden=hidden, heads=heads, batch=layer_batch,
                                                  repeats=repeats, separable=separable)
                 for separable in (True, False)}
        rows.append({
            "tokens": f"{size}x{size}",
            "fast_ms": 1e3 * cases[True]["seconds"],
            "general_ms": 1e3 * cases[False]["seconds"],
            "speedup": cases[False]["seconds"] / cases[True]["seconds"],
            "fast_peak_mib": cases[True]["peak_memory_mib"],
            "general_peak_mib": cases[False]["peak_memory_mib"],
            "max_abs_difference": _max_difference(size, hidden, heads),
            "fast_mode": cases[True]["mode"],
        })
    return rows


def matmul_gflops(n, repeats=5):
    """GFLOP/s of an n x n float32 matmul, the machine's reference rate in this run."""
    a = ops.convert_to_tensor(np.random.default_rng(0).normal(size=(n, n)).astype("float32"))

    def step():
        ops.convert_to_numpy(ops.matmul(a, a)[0, 0])

    seconds, _ = _timed(step, repeats)
    return 2 * n**3 / seconds / 1e9


def model_step_benchmark(models, precisions, model_batch, repeats, reference_gflops, **_):
    rows = []
    for precision in precisions:
        keras.mixed_precision.set_dtype_policy(precision)
        try:
            for name in models:
                keras.utils.set_random_seed(0)
                model = build_model(name)
                model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
                x = np.random.default_rng(0).normal(size=(model_batch, *model.input_shape[1:])).astype("float32")
                y = np.arange(model_batch) % 10
                seconds, compile_seconds = _timed(lambda: model.train_on_batch(x, y), repeats)
                # Forward + backward ~ 3x the forward pass.
                gflops = 3 * count_flops(model).total * model_batch / seconds / 1e9
                rows.append({"model": name, "precision": precision, "batch": model_batch,
                             "step_ms": 1e3 * seconds, "images_per_second": model_batch / seconds,
                             "compile_seconds": compile_seconds, "achieved_gflops": gflops,
                             "fraction_of_matmul": gflops / reference_gflops})
        finally:
            keras.mixed_precision.set_dtype_policy("float32")
    return rows


def machine():
    return {"backend": keras.backend.backend(), "keras": keras.__version__, "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "platform": platform.platform()}


def run_benchmark(quick=False, output="bench.json", **overrides):
    """Runs (a), (b), (c); writes JSON to `output` and a markdown table beside it; returns the results."""
    settings = {**(QUICK if quick else FULL), **overrides}
    reference = matmul_gflops(settings["matmul"])
    results = {
        "machine": machine(),
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
        "matmul_gflops": reference,
        "layer": layer_benchmark(**settings),
        "models": model_step_benchmark(reference_gflops=reference, **settings),
    }
    with open(output, "w") as f:
        json.dump(results, f, indent=2)
    markdown = markdown_tables(results)
    with open(os.path.splitext(output)[0] + ".md", "w") as f:
        f.write(markdown + "\n")
    return results


def markdown_tables(results):
    m = results["machine"]
    settings = results["settings"]
    lines = [
        f"Machine: {m['processor']}, {m['cpus']} CPUs, Keras {m['keras']} on {m['backend']}; "
        f"reference {settings['matmul']}x{settings['matmul']} float32 matmul: {results['matmul_gflops']:.1f} GFLOP/s.",
        "",
        f"Attention layer ({settings['heads']} heads, hidden {settings['hidden']}, batch {settings['layer_batch']}), "
        "forward + backward, XLA:",
        "",
        "| tokens | fast (separable) ms | general ms | speed-up | fast peak MiB | general peak MiB | max abs diff |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["layer"]:
        lines.append(f"| {row['tokens']} | {row['fast_ms']:.1f} | {row['general_ms']:.1f} | {row['speedup']:.2f}x "
                     f"| {row['fast_peak_mib']:.0f} | {row['general_peak_mib']:.0f} "
                     f"| {row['max_abs_difference']:.1e} |")
    lines += ["", f"Training step (batch {settings['model_batch']}, XLA):", "",
              "| model | precision | step ms | images/s | GFLOP/s | of matmul | step vs resnet |",
              "|---|---|---|---|---|---|---|"]
    resnet = {r["precision"]: r["step_ms"] for r in results["models"] if r["model"].startswith("resnet")}
    for row in results["models"]:
        ratio = row["step_ms"] / resnet[row["precision"]] if row["precision"] in resnet else float("nan")
        lines.append(f"| `{row['model']}` | {row['precision']} | {row['step_ms']:.0f} "
                     f"| {row['images_per_second']:.1f} | {row['achieved_gflops']:.1f} "
                     f"| {100 * row['fraction_of_matmul']:.0f}% | {ratio:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(layer_case(**json.loads(sys.argv[2]))))
