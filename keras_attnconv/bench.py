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
from keras_attnconv.utils import machine

FULL = {"sizes": (16, 32, 64), "hidden": 400, "heads": 9, "layer_batch": 2, "repeats": 5,
        "models": ("quadratic", "learned", "learned_content", "resnet18"),
        "precisions": ("float32", "mixed_bfloat16"), "model_batch": 16, "matmul": 2048}
QUICK = {"sizes": (8, 16), "hidden": 32, "heads": 9, "layer_batch": 2, "repeats": 3,
         "models": ("quadratic_tiny", "resnet_tiny"), "precisions": ("float32",), "model_batch": 8, "matmul": 512}
# The layer benchmark (a) runs in float32 whatever Keras' global dtype policy: its max abs difference is float32's.
LAYER_DTYPE = "float32"


def _interleaved(steps, repeats):
    """Median seconds of each of `steps` (name -> callable), measured in turns.

    Each step is called once first (that call compiles; its time is returned
    too), then all steps run one after the other, `repeats` rounds: a
    machine that slows down or speeds up mid-run affects every step alike, so
    the ratios between them hold even when absolute times drift.
    """
    times = {name: [] for name in steps}
    compile_seconds = {}
    for name, step in steps.items():
        start = time.perf_counter()
        step()
        compile_seconds[name] = time.perf_counter() - start
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}, compile_seconds


def _layer_model(size, hidden, heads, separable):
    inputs = keras.Input((size, size, hidden))
    attention = RelativeMultiHeadAttention(heads, position_score="quadratic", separable=separable,
                                           dtype=LAYER_DTYPE, name="attention")
    model = keras.Model(inputs, attention(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", jit_compile=True)
    return model


def _layer_step(size, hidden, heads, batch, separable, seed=0):
    """(model, forward + backward step) of one attention layer: a training step with a zero learning rate."""
    keras.utils.set_random_seed(seed)
    model = _layer_model(size, hidden, heads, separable)
    x = np.random.default_rng(seed).normal(size=(batch, size, size, hidden)).astype("float32")
    y = np.zeros_like(x)
    return model, lambda: model.train_on_batch(x, y)


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


def layer_memory(size, hidden, heads, batch, separable, seed=0):
    """Peak memory (MiB) of the layer's forward + backward step, and the path it took.

    Peak memory is the rise of the process' resident set during two steps
    after compilation (Linux); elsewhere, during compilation and steps. Run
    in a fresh process (`_in_workers`) so that the peak is this case's own.
    """
    model, step = _layer_step(size, hidden, heads, batch, separable, seed)
    step()
    if _reset_peak_memory():
        baseline = _memory_kib("VmRSS")
        step(), step()
        peak_kib = _memory_kib("VmHWM") - baseline
    else:
        baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        step(), step()
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline
    return {"peak_memory_mib": peak_kib / 1024, "mode": model.get_layer("attention").attention_mode}


def _in_workers(cases):
    """Runs `layer_memory` for each case in its own fresh interpreter, all at once.

    One process per case so that each peak is that case's own; concurrently
    because memory, unlike time, does not depend on sharing the CPU.
    """
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    workers = [subprocess.Popen([sys.executable, "-m", "keras_attnconv.bench", "--worker", json.dumps(case)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
               for case in cases]
    results = []
    for case, worker in zip(cases, workers):
        stdout, stderr = worker.communicate()
        if worker.returncode != 0:
            raise RuntimeError(f"benchmark worker failed for {case}:\n{stderr[-2000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def _max_difference(size, hidden, heads, seed=0):
    """Max |fast - general| of the layer outputs for the same weights and input (batch 1)."""
    keras.utils.set_random_seed(seed)
    fast = RelativeMultiHeadAttention(heads, position_score="quadratic", separable=True, dtype=LAYER_DTYPE)
    general = RelativeMultiHeadAttention(heads, position_score="quadratic", separable=False, dtype=LAYER_DTYPE)
    x = np.random.default_rng(seed).normal(size=(1, size, size, hidden)).astype("float32")
    fast.build(x.shape)
    general.build(x.shape)
    general.set_weights(fast.get_weights())
    return float(np.abs(ops.convert_to_numpy(fast(x)) - ops.convert_to_numpy(general(x))).max())


def layer_benchmark(sizes, hidden, heads, layer_batch, repeats, **_):
    shapes = [{"size": size, "hidden": hidden, "heads": heads, "batch": layer_batch} for size in sizes]
    memory = iter(_in_workers([{**shape, "separable": separable} for shape in shapes for separable in (True, False)]))
    rows = []
    for shape in shapes:
        fast_memory, general_memory = next(memory), next(memory)
        steps = {path: _layer_step(**shape, separable=path == "fast")[1] for path in ("fast", "general")}
        seconds, _ = _interleaved(steps, repeats)
        size = shape["size"]
        rows.append({
            "tokens": f"{size}x{size}",
            "fast_ms": 1e3 * seconds["fast"],
            "general_ms": 1e3 * seconds["general"],
            "speedup": seconds["general"] / seconds["fast"],
            "fast_peak_mib": fast_memory["peak_memory_mib"],
            "general_peak_mib": general_memory["peak_memory_mib"],
            "max_abs_difference": _max_difference(size, hidden, heads),
            "fast_mode": fast_memory["mode"],
        })
    return rows


def _matmul_step(n):
    """An n x n float32 matmul (2 n^3 FLOPs), the machine's reference rate."""
    a = ops.convert_to_tensor(np.random.default_rng(0).normal(size=(n, n)).astype("float32"))
    return lambda: ops.convert_to_numpy(ops.matmul(a, a)[0, 0])


def _model_step(name, model_batch, precision):
    model = build_model(name, seed=0, dtype=precision)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    x = np.random.default_rng(0).normal(size=(model_batch, *model.input_shape[1:])).astype("float32")
    y = np.arange(model_batch) % 10
    return model, lambda: model.train_on_batch(x, y)


def model_step_benchmark(models, precisions, model_batch, repeats, matmul, **_):
    """Training steps of `models` (built with ``dtype=precision``) and the reference matmul, in turns, per precision."""
    rows = []
    for precision in precisions:
        built = {name: _model_step(name, model_batch, precision) for name in models}
        steps = {name: step for name, (_, step) in built.items()}
        seconds, compile_seconds = _interleaved({**steps, "matmul": _matmul_step(matmul)}, repeats)
        reference = 2 * matmul**3 / seconds["matmul"] / 1e9
        for name, (model, _) in built.items():
            # Forward + backward ~ 3x the forward pass.
            gflops = 3 * count_flops(model).total * model_batch / seconds[name] / 1e9
            rows.append({"model": name, "precision": precision, "batch": model_batch,
                         "step_ms": 1e3 * seconds[name], "images_per_second": model_batch / seconds[name],
                         "compile_seconds": compile_seconds[name], "achieved_gflops": gflops,
                         "matmul_gflops": reference, "fraction_of_matmul": gflops / reference})
    return rows


def run_benchmark(quick=False, output="bench.json", **overrides):
    """Runs (a), (b), (c); writes JSON to `output` and a markdown table beside it; returns the results."""
    settings = {**(QUICK if quick else FULL), **overrides}
    results = {
        "machine": machine(),
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
        "layer": layer_benchmark(**settings),
        "models": model_step_benchmark(**settings),
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
        f"Machine: {m['processor']}, {m['cpus']} CPUs, Keras {m['keras']} on {m['backend']}. "
        f"Medians of {settings['repeats']} rounds; in each round the compared steps run one after the other.",
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
    matmul = settings["matmul"]
    lines += ["", f"Training step (batch {settings['model_batch']}, XLA), in turns with a {matmul}x{matmul} "
              "float32 matmul (the reference rate):", "",
              "| model | precision | step ms | images/s | GFLOP/s | matmul GFLOP/s | of matmul | step vs resnet |",
              "|---|---|---|---|---|---|---|---|"]
    resnet = {r["precision"]: r["step_ms"] for r in results["models"] if r["model"].startswith("resnet")}
    for row in results["models"]:
        ratio = row["step_ms"] / resnet[row["precision"]] if row["precision"] in resnet else float("nan")
        lines.append(f"| `{row['model']}` | {row['precision']} | {row['step_ms']:.0f} "
                     f"| {row['images_per_second']:.1f} | {row['achieved_gflops']:.1f} | {row['matmul_gflops']:.1f} "
                     f"| {100 * row['fraction_of_matmul']:.0f}% | {ratio:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(layer_memory(**json.loads(sys.argv[2]))))
