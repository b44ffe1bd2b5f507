"""The GPU suite of `attnconv bench --suite gpu`: training steps of the paper's models on an accelerator.

For each model and precision (float32, mixed_bfloat16, mixed_float16 with
loss scaling), in a fresh worker process of its own:

- compile time: the first training step;
- ms per training step, waiting for the device after every step (a
  `train_on_batch` returns the loss to the host): the median of `steps`
  steps after `warmup_steps`;
- images/s through `model.fit` on in-memory arrays: one warm-up epoch, then
  one timed epoch of `fit_images` images, with the step compiled for the
  timed steps above (each image weighs 1 in both, so both take one program);
- peak device memory (the allocator's peak, every allocation of the
  process; a process peak resident set on a CPU), and the step's own
  memory, as XLA assigned it (`largest_program_mib`);
- achieved TFLOP/s (the forward FLOPs of `attnconv list` on the path taken,
  times 3 for forward + backward) and its fraction of a large matmul in the
  compute dtype, timed by its own worker in the same run.

The quadratic model runs on each of its attention paths (the separable row
and column passes and the dense position contraction), so that the
per-platform rule of `keras_attnconv.layers.path_rule` can be checked
against the same run; `auto_path` says which one the rule picks here.
One model (`unscaled_float16_of`) is also measured in mixed_float16 without
loss scaling: Keras wraps the optimizer in a `LossScaleOptimizer` under
mixed_float16 (a finiteness check of every gradient and a conditional update
each step), and that case puts a figure on its cost beside the scaled one.

Below the tables, the targets of `keras_attnconv.bench.gpu_targets` that the
run judges, met or missed; a run on a device they are not set for (a CPU)
judges none and says so, in the table and on stderr when it starts.

Runs without TensorFlow (`KERAS_BACKEND=jax`), the way the GPU machine has it.
"""

import json
import sys

import keras
import numpy as np
from keras import ops

from keras_attnconv.analysis.charts import precision_label
from keras_attnconv.analysis.throughput import Throughput
from keras_attnconv.bench.gpu_targets import TARGETS, gpu_of, gpu_targets_markdown
from keras_attnconv.bench.measure import (
    device_peak_memory,
    interleaved,
    matmul_step,
    random_images,
    read_step,
    run_in_workers,
    xla_cost,
)
from keras_attnconv.models import build_model, count_flops, get_model_config, with_attention_options
from keras_attnconv.models.precision import PRECISIONS, check_precisions
from keras_attnconv.utils.reports import (
    code_digest,
    device_description,
    device_text,
    json_settings,
    report_paths,
    write_report,
)

# The recipes' precision first: a run cut short by a time limit has the rows the targets are about.
GPU_FULL = {
    "models": ("quadratic", "gaussian", "learned", "learned_content", "resnet18"),
    "precisions": ("mixed_bfloat16", *(p for p in PRECISIONS if p != "mixed_bfloat16")),
    "paths_of": "quadratic",
    "unscaled_float16_of": "resnet18",
    "batch": 100,
    "image_size": 32,
    "warmup_steps": 5,
    "steps": 20,
    "fit_images": 5000,
    "matmul": 8192,
    "read_mib": 1024,
}
# Tiny shapes, a smoke test of every measurement (it runs in the CPU test suite): not a benchmark.
GPU_QUICK = {
    "models": ("quadratic_tiny", "resnet_tiny"),
    "precisions": ("mixed_float16",),
    "paths_of": "quadratic_tiny",
    "unscaled_float16_of": "resnet_tiny",
    "batch": 4,
    "image_size": 8,
    "warmup_steps": 1,
    "steps": 3,
    "fit_images": 8,
    "matmul": 128,
    "read_mib": 4,
}
PATHS = {"separable": True, "position": False}  # the quadratic model's paths, as the layer's `separable` forces them


def _attention_path(model):
    """The path of the model's first attention layer on this device, or None for a model without attention."""
    for layer in model.layers:
        if hasattr(layer, "attention"):
            return layer.attention.attention_mode
    return None


def build_case_model(model, precision, image_size, forced_path=None, loss_scaling=True):
    """A GPU-suite case's model, compiled as the suite trains it (SGD, a from-logits loss, XLA); and the path the
    rule picked for it, before `forced_path` (a key of `PATHS`) replaced it."""
    built = build_model(model, seed=0, dtype=precision, image_size=image_size)
    auto_path = _attention_path(built)
    if forced_path is not None:
        built = with_attention_options(built, separable=PATHS[forced_path])
    built.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
        auto_scale_loss=loss_scaling,  # Keras' default; it only acts under mixed_float16
    )
    return built, auto_path


def measure_case(
    model,
    precision,
    batch,
    image_size,
    warmup_steps,
    steps,
    fit_images,
    forced_path=None,
    loss_scaling=True,
    paths_of=None,
    **_,
):
    """One model in one precision (on one forced attention path): times, throughput, memory. A worker's job.

    The model measured on each path (`paths_of`) also gets XLA's count of its step's FLOPs and bytes (on JAX):
    one more compilation, so only there. `loss_scaling` False compiles without Keras' loss scaling.
    """
    keras.utils.set_random_seed(0)
    built, auto_path = build_case_model(model, precision, image_size, forced_path, loss_scaling)
    x = ops.convert_to_tensor(random_images(batch, image_size))
    y = ops.convert_to_tensor((np.arange(batch) % 10).astype("int32"))
    # Every image weighs 1, in the timed steps and in `fit` alike. Without weights `train_on_batch` hands the
    # step (x, y, None) and `fit` (x, y): two programs, and `fit` compiled the step again (on an H200 a full
    # model's compilation is tens of seconds of the device's time). With them the step is compiled once; the
    # loss is the same, for one more multiply of `batch` numbers.
    weights = ops.ones((batch,), "float32")

    def step():
        # The returned loss is a host float: the step has finished on the device.
        losses.append(built.train_on_batch(x, y, sample_weight=weights))

    losses = []
    seconds, compile_seconds = interleaved({"step": step}, steps, warmup=warmup_steps)
    step_seconds = seconds["step"]

    images = random_images(fit_images, image_size, seed=1)
    labels = (np.arange(fit_images) % 10).astype("int32")
    # The epoch's end waits for the device (its logs are read on the host); the first epoch is the warm-up.
    throughput = Throughput(fit_images)
    built.fit(
        images,
        labels,
        sample_weight=np.ones(fit_images, "float32"),
        batch_size=batch,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[throughput],
    )
    peak_mib, memory_source = device_peak_memory()
    flops_per_step = 3 * count_flops(built).total * batch  # forward + backward ~ 3x the forward pass
    cost = xla_cost(built, x, y) if model == paths_of else None
    return {
        "model": model,
        "precision": precision,
        "forced_path": forced_path,
        "path": _attention_path(built),
        "auto_path": auto_path,
        "loss_scaling": loss_scaling,
        # What the step ran with: Keras wraps the optimizer in a LossScaleOptimizer under mixed_float16 only.
        "loss_scale_optimizer": isinstance(built.optimizer, keras.optimizers.LossScaleOptimizer),
        "batch": batch,
        "compile_seconds": compile_seconds["step"],
        "step_ms": 1e3 * step_seconds,
        "steps_timed": steps,
        "fit_images_per_second": throughput.images_per_second,
        "fit_images": fit_images,
        "peak_memory_mib": peak_mib,
        "memory_source": memory_source,
        "flops_per_step": flops_per_step,
        "achieved_tflops": flops_per_step / step_seconds / 1e12,
        "finite_loss": bool(np.isfinite(losses).all()),
        "xla_flops": cost and cost["flops"],
        "xla_bytes": cost and cost["bytes_accessed"],
    }


def measure_references(matmul, read_mib, repeats=10, **_):
    """The device, versions, an n x n matmul's rate in each compute dtype, the read bandwidth. A worker's job."""
    dtypes = ("float32", "bfloat16", "float16")
    seconds, _ = interleaved(
        {**{dtype: matmul_step(matmul, dtype) for dtype in dtypes}, "read": read_step(read_mib)}, repeats
    )
    rates = {dtype: 2 * matmul**3 / seconds[dtype] / 1e12 for dtype in dtypes}
    read_gbps = read_mib * 2**20 / seconds["read"] / 1e9
    return {"device": device_description(), "matmul_tflops": rates, "read_gbps": read_gbps}


def floor_ms(row, matmul_tflops, read_gbps):
    """The least time the device needs for the step's work, None without XLA's count of it.

    The FLOPs at the compute dtype's matmul rate or XLA's bytes at the read bandwidth, whichever takes
    longer. The FLOPs are the larger of the two counts: XLA's own leaves out the matmuls it hands to a
    library on a GPU (an H100 gave 76 GFLOP for a 2.7 TFLOP step), the formula leaves out element-wise work.
    """
    if row.get("xla_flops") is None:
        return None
    compute_dtype = keras.DTypePolicy(row["precision"]).compute_dtype
    flops = max(row["flops_per_step"], row["xla_flops"])
    return 1e3 * max(flops / (matmul_tflops[compute_dtype] * 1e12), row["xla_bytes"] / (read_gbps * 1e9))


def cases(settings):
    """One case per (precision, model, path): the quadratic model on each of its paths, the others on theirs.

    In mixed_float16, `unscaled_float16_of` is measured a second time, without loss scaling.
    """
    found = []
    for precision in settings["precisions"]:
        for model in settings["models"]:
            paths = list(PATHS) if model == settings["paths_of"] else [None]
            case = {**settings, "model": model, "precision": precision, "loss_scaling": True}
            found += [{**case, "forced_path": path} for path in paths]
            if precision == "mixed_float16" and model == settings.get("unscaled_float16_of"):
                found.append({**case, "forced_path": None, "loss_scaling": False})
    return found


def _case_key(case):
    """What a case is (a row of the results carries the same fields as the case it measured).

    Rows written before cases had `loss_scaling` were all measured with it.
    """
    return case["model"], case["precision"], case["forced_path"], case.get("loss_scaling", True)


def _previous_results(output, settings, code):
    """The results already in `output` from a run with the same settings and code (to go on from), else None.

    Rows measured by other code (a layer changed since) are not the current code's figures: a table never
    holds both.
    """
    try:
        with open(report_paths(output)[0]) as f:
            previous = json.load(f)
    except (OSError, ValueError):
        return None
    return previous if previous.get("settings") == settings and previous.get("code") == code else None


def run_gpu_benchmark(quick=False, output="bench-gpu.json", command=None, **overrides):
    """Runs the GPU suite (one worker per case, one at a time); writes JSON and a markdown table beside it.

    The results are written after every case, and a run goes on from the
    cases already in `output` when their settings and the package's code
    (`code_digest`) are the same: the same command run again after a time
    limit or a crash finishes the table instead of starting over. The reference matmul rates are the first
    invocation's, measured on the same device.
    """
    settings = json_settings({**(GPU_QUICK if quick else GPU_FULL), **overrides})
    check_precisions(settings["precisions"])
    for model in settings["models"]:
        # An unknown name (with the closest ones) or a size the model cannot take fails here, not in a worker.
        get_model_config(model, image_size=settings["image_size"])
    code = code_digest()
    # A file goes on with the same settings and `code` alone: one written before files recorded the package's
    # commit (`write_report`'s "package") is taken like any other. Its "package" is the last writer's: the rows
    # of earlier calls may have come from other commits, but the same `code` means the same Python sources of
    # the package, so those commits differ only elsewhere (documents, tests, results), not in what measured.
    results = _previous_results(output, settings, code)
    if results is None:
        references = run_in_workers("gpu-references", [settings], concurrently=False)[0]
        results = {
            "command": command,
            "device": references["device"],
            "matmul_tflops": references["matmul_tflops"],
            "read_gbps": references["read_gbps"],
            "settings": settings,
            "code": code,
            "rows": [],
        }
    if gpu_of(results["device"]) is None:
        print(
            f"The gpu suite on {results['device'].get('device', 'an unknown device')}: not a GPU the targets are set "
            f"for ({' and '.join(TARGETS)}). Its figures are this device's and judge none of them.",
            file=sys.stderr,
        )
    done = {_case_key(row) for row in results["rows"]}
    for case in cases(settings):
        if _case_key(case) in done:
            continue
        row = run_in_workers("gpu-case", [case], concurrently=False, program_memory=True)[0]
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
    versions = ", ".join(
        f"{name} {device[name]}" for name in ("keras", "jax", "jaxlib", "tensorflow", "python") if name in device
    )
    lines = [
        f"Device: {device_text(device)}; backend {device['backend']}; {versions}.",
        f"Command: `{results['command']}`" if results.get("command") else None,
        f"Batch {settings['batch']}, {settings['image_size']}x{settings['image_size']}x3 inputs, XLA. Step: median "
        f"of {settings['steps']} training steps after {settings['warmup_steps']}, each waited for. Fit: "
        f"{settings['fit_images']} images after a warm-up epoch. Reference matmul "
        f"{settings['matmul']}x{settings['matmul']}: "
        + ", ".join(f"{d} {r:.3g}" for d, r in rates.items())
        + f" TFLOP/s; read bandwidth ({settings['read_mib']} MiB) {results['read_gbps']:.4g} GB/s.",
        "",
        "| model | path | precision | compile s | step ms | fit images/s | peak MiB | step MiB | TFLOP/s | of matmul |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        path = row["path"] or "-"
        if row["path"] is not None and row["path"] == row["auto_path"]:
            path += " (auto)"
        step_mib = "-" if row.get("program_mib") is None else f"{row['program_mib']:.0f}"
        lines.append(
            f"| `{row['model']}` | {path} | {precision_label(row)} | {row['compile_seconds']:.1f} "
            f"| {row['step_ms']:.2f} | {row['fit_images_per_second']:.0f} | {row['peak_memory_mib']:.0f} "
            f"| {step_mib} | {row['achieved_tflops']:.3g} | {100 * row['fraction_of_matmul']:.0f}% |"
        )
    memory = {row["memory_source"] for row in results["rows"]}
    lines += [
        "",
        f"Peak memory: {', '.join(sorted(memory))}. Step MiB: the memory XLA assigned to the compiled training step "
        "(its buffers at their peak, the same on every run); a device allocator's peak counts every allocation the "
        "process made on the device, whatever made it.",
    ]
    floors = [(row, floor_ms(row, rates, results["read_gbps"])) for row in results["rows"]]
    floors = [(row, floor) for row, floor in floors if floor is not None]
    if floors:
        lines += [
            "",
            "The step beside the device's floor: the step's FLOPs (the larger of 3x the forward formula and "
            "XLA's count of one forward + backward pass) at the matmul rate, or XLA's bytes at the read "
            "bandwidth, whichever is longer. Fit ms: batch / fit images/s (steps not waited for one by one).",
            "",
            "| model | path | precision | step ms | fit ms | formula GFLOP | XLA GFLOP | XLA GB | floor ms "
            "| step / floor | fit / floor |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row, floor in floors:
            fit_ms = 1e3 * settings["batch"] / row["fit_images_per_second"]
            lines.append(
                f"| `{row['model']}` | {row['path']} | {precision_label(row)} | {row['step_ms']:.2f} "
                f"| {fit_ms:.2f} | {row['flops_per_step'] / 1e9:.4g} | {row['xla_flops'] / 1e9:.4g} "
                f"| {row['xla_bytes'] / 1e9:.3g} | {floor:.3g} | {row['step_ms'] / floor:.1f}x "
                f"| {fit_ms / floor:.1f}x |"
            )
    lines += ["", gpu_targets_markdown(results)]
    return "\n".join(line for line in lines if line is not None)
