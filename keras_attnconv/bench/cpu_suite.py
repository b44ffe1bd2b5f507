"""The CPU suite of `attnconv bench` (the default): everything measured side by side in one run.

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

import keras
import numpy as np
from keras import ops

from keras_attnconv.bench.measure import interleaved, matmul_step, process_peak_rise_mib, run_in_workers
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


def layer_memory(size, hidden, heads, batch, separable, seed=0):
    """Peak memory (MiB) of the layer's forward + backward step, and the path it took.

    Peak memory is the rise of the process' resident set during two steps
    after compilation (Linux); elsewhere, during compilation and steps. Run
    in a fresh process (`run_in_workers`) so that the peak is this case's own.
    """
    model, step = _layer_step(size, hidden, heads, batch, separable, seed)
    step()
    return {"peak_memory_mib": process_peak_rise_mib(step), "mode": model.get_layer("attention").attention_mode}


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
    # Memory, unlike time, does not depend on sharing the CPU: the workers run at once.
    memory = iter(run_in_workers("layer-memory", [{**shape, "separable": separable}
                                                  for shape in shapes for separable in (True, False)],
                                 concurrently=True))
    rows = []
    for shape in shapes:
        fast_memory, general_memory = next(memory), next(memory)
        steps = {path: _layer_step(**shape, separable=path == "fast")[1] for path in ("fast", "general")}
        seconds, _ = interleaved(steps, repeats)
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
        seconds, compile_seconds = interleaved({**steps, "matmul": matmul_step(matmul, "float32")}, repeats)
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

