"""The CPU suite of `attnconv bench` (the default): everything measured side by side in one run.

(a) the attention layer, forward + backward, at growing token grids, each
    fast path against its baseline (`LAYER_COMPARISONS`: the separable passes
    vs the general eq. (8) path; a 7x7 neighbourhood vs global content
    attention): time ratio, the memory of each compiled step (XLA's buffer
    assignment, `measure.largest_program_mib`, in a fresh worker process per
    case), max abs difference to what the fast path must equal;
(b) training-step throughput of the paper's models against ResNet-18;
(c) each step's achieved GFLOP/s as a fraction of a large matmul's, measured
    in the same run;
(d) the memory of training local and global models on large images: the
    compiled step's and the whole process' peak (compilation included);
(e) inference in each export format's runtime beside Keras (`formats`).

Only `keras`, `keras.ops` and NumPy are used, so the benchmark runs on any
backend. Times on a shared machine are noisy: compare the ratios, not the
absolute numbers, and only between rows of the same run.
"""

import keras
import numpy as np
from keras import ops

from keras_attnconv.bench.formats import FORMATS_FULL, FORMATS_QUICK, format_benchmark, formats_markdown
from keras_attnconv.bench.measure import (
    device_peak_memory,
    interleaved,
    matmul_step,
    path_label,
    random_images,
    run_in_workers,
)
from keras_attnconv.bench.step_targets import targets_markdown
from keras_attnconv.layers import RelativeMultiHeadAttention
from keras_attnconv.models import build_model, element_clusters, get_model_config
from keras_attnconv.models.precision import check_precisions
from keras_attnconv.models.step_compilation import model_gflops, resolve_jit_compile
from keras_attnconv.utils.console import retracing_warnings_off
from keras_attnconv.utils.reports import cpu_capabilities, json_settings, machine, machine_text, write_report

_CONTENT = {"position_score": None, "use_content_content": True, "use_position_bias": False}
# Each layer comparison: the fast path, what it is timed against, and what its outputs must equal.
LAYER_COMPARISONS = {
    # Position-only quadratic heads: row and column passes vs the (heads, T, T) contraction (the same function).
    "separable": {
        "fast": {"position_score": "quadratic", "separable": True},
        "baseline": {"position_score": "quadratic", "separable": False},
        "reference": {"position_score": "quadratic", "separable": False},
    },
    # Content attention (the paper's key_dim = hidden): a 7x7 neighbourhood vs global attention; its outputs
    # equal global attention with the window as an explicit mask.
    "window7": {
        "fast": {**_CONTENT, "window": 7, "windowed": True},
        "baseline": _CONTENT,
        "reference": {**_CONTENT, "window": 7, "windowed": False},
    },
}


def _memory_cases(names, batches, **options):
    """Model-memory cases (d): each model at each batch, with its registered options updated by `options`."""
    return [{"name": name, "batch": batch, "options": dict(options)} for name in names for batch in batches]


FULL = {
    "sizes": (16, 32, 64),
    "hidden": 400,
    "heads": 9,
    "layer_batch": 2,
    "repeats": 5,
    "comparisons": ("separable", "window7"),
    "models": ("quadratic", "learned", "learned_content", "learned_content_local", "resnet18"),
    "precisions": ("float32", "mixed_bfloat16"),
    "model_batch": 16,
    "matmul": 2048,
    "memory_models": _memory_cases(("learned_content_local", "learned_content"), batches=(8,))
    + _memory_cases(("learned_content_local", "learned_content"), batches=(8,), rematerialize=True)
    + _memory_cases(("learned_content_local",), batches=(4,), rematerialize=True),
    "memory_image_size": 64,
    "format_models": FORMATS_FULL["format_models"],
    "bfloat16_serving": FORMATS_FULL["bfloat16_serving"],
}
QUICK = {
    "sizes": (16,),  # one grid: each size costs two worker processes (memory) and a timed pair
    "hidden": 32,
    "heads": 9,
    "layer_batch": 2,
    "repeats": 3,
    "comparisons": ("separable", "window7"),
    "models": ("quadratic_tiny", "resnet_tiny"),
    "precisions": ("float32",),
    "model_batch": 8,
    "matmul": 512,
    # One case, with an option: each case is a worker process of its own (about 9 s on two CPU cores).
    "memory_models": _memory_cases(("learned_content_local_tiny",), batches=(2,), rematerialize=True),
    "memory_image_size": 16,
    "format_models": FORMATS_QUICK["format_models"],
    "bfloat16_serving": FORMATS_QUICK["bfloat16_serving"],
}  # as `--suite formats --quick`: every row runs
# The layer benchmark (a) runs in float32 whatever Keras' global dtype policy: its max abs difference is float32's.
LAYER_DTYPE = "float32"


def _layer(heads, layer, **kwargs):
    return RelativeMultiHeadAttention(heads, **layer, dtype=LAYER_DTYPE, **kwargs)


def _layer_step(size, hidden, heads, batch, layer, seed=0):
    """(model, forward + backward step) of one attention layer: a training step with a zero learning rate."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((size, size, hidden))
    model = keras.Model(inputs, _layer(heads, layer, name="attention")(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", jit_compile=True)
    x = np.random.default_rng(seed).normal(size=(batch, size, size, hidden)).astype("float32")
    y = np.zeros_like(x)
    return model, lambda: model.train_on_batch(x, y)


def layer_memory(size, hidden, heads, batch, layer, seed=0):
    """Compiles and runs the layer's forward + backward step once; the path it took.

    Run in a worker with ``program_memory`` (`run_in_workers`): the memory
    of the step is what XLA assigned to the compiled program.
    """
    model, step = _layer_step(size, hidden, heads, batch, layer, seed)
    step()
    return {"mode": model.get_layer("attention").attention_mode}


def _max_difference(size, hidden, heads, fast, reference, seed=0):
    """Max |fast - reference| of the layer outputs for the same weights and input (batch 1)."""
    keras.utils.set_random_seed(seed)
    layers = _layer(heads, fast), _layer(heads, reference)
    x = np.random.default_rng(seed).normal(size=(1, size, size, hidden)).astype("float32")
    for layer in layers:
        layer.build(x.shape)
    layers[1].set_weights(layers[0].get_weights())
    outputs = [ops.convert_to_numpy(layer(x)) for layer in layers]
    return float(np.abs(outputs[0] - outputs[1]).max())


def layer_benchmark(sizes, hidden, heads, layer_batch, repeats, comparisons, **_):
    """Each comparison's fast path against its baseline at each grid size: time, peak memory, exactness."""
    shapes = [{"size": size, "hidden": hidden, "heads": heads, "batch": layer_batch} for size in sizes]
    pairs = [(name, shape) for name in comparisons for shape in shapes]
    # Memory, unlike time, does not depend on sharing the CPU: the workers run at once, two by two.
    memory = []
    for name, shape in pairs:
        memory += run_in_workers(
            "layer-memory",
            [{**shape, "layer": LAYER_COMPARISONS[name][path]} for path in ("fast", "baseline")],
            concurrently=True,
            program_memory=True,
        )
    memory = iter(memory)
    rows = []
    for name, shape in pairs:
        comparison = LAYER_COMPARISONS[name]
        fast_memory, baseline_memory = next(memory), next(memory)
        steps = {path: _layer_step(**shape, layer=comparison[path])[1] for path in ("fast", "baseline")}
        seconds, _ = interleaved(steps, repeats)
        size = shape["size"]
        rows.append(
            {
                "comparison": name,
                "tokens": f"{size}x{size}",
                "fast_ms": 1e3 * seconds["fast"],
                "baseline_ms": 1e3 * seconds["baseline"],
                "speedup": seconds["baseline"] / seconds["fast"],
                "fast_step_mib": fast_memory["program_mib"],
                "baseline_step_mib": baseline_memory["program_mib"],
                "max_abs_difference": _max_difference(size, hidden, heads, comparison["fast"], comparison["reference"]),
                "fast_mode": fast_memory["mode"],
                "baseline_mode": baseline_memory["mode"],
            }
        )
    return rows


def model_memory(name, image_size, batch, options=None, steps=3):
    """Peak resident memory (MiB, the whole process, compilation included) of a model training `steps` steps.

    Run in a worker with ``program_memory`` (`model_memory_benchmark`), which adds the compiled step's own.

    `options` are config fields set on top of the registered model's (e.g. ``{"rematerialize": True}``).
    """
    options = options or {}
    model, step = _model_step(name, batch, "float32", image_size=image_size, **options)
    for _ in range(steps):
        step()
    peak_mib, _ = device_peak_memory()
    return {
        "model": name,
        "options": options,
        "image_size": image_size,
        "batch": batch,
        "steps": steps,
        "peak_memory_mib": peak_mib,
    }


def model_memory_benchmark(memory_models, memory_image_size, **_):
    """`model_memory` of each case (a dict of name, batch and options), each in its own worker process."""
    rows = run_in_workers(
        "model-memory",
        [{**case, "image_size": memory_image_size} for case in memory_models],
        concurrently=False,
        program_memory=True,
    )
    return [{**row, "step_mib": row.pop("program_mib")} for row in rows]


def _model_step(name, model_batch, precision, image_size=32, jit_compile=True, **options):
    model = build_model(name, seed=0, dtype=precision, image_size=image_size, **options)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    x = random_images(model_batch, image_size)
    y = np.arange(model_batch) % 10
    return model, lambda: model.train_on_batch(x, y)


def step_paths():
    """The compilers a training step can take on this backend: XLA (True), and TensorFlow's graph (False)."""
    return (True, False) if keras.backend.backend() == "tensorflow" else (True,)


def _path_name(jit_compile):
    return "xla" if jit_compile else "graph"


@retracing_warnings_off()  # a model per path and precision: each traces its own step, as meant
def model_step_benchmark(models, precisions, model_batch, repeats, matmul, **_):
    """Training steps of `models` on every path (`step_paths`), in every precision, with the matmul on each path.

    Per precision, every (model, path) step and an n x n matmul in the
    precision's compute dtype on each path run in turns. A row's fraction is
    its achieved GFLOP/s over the best matmul rate of its precision (the
    device's reference for that dtype); ``rule`` marks the path that
    ``jit_compile="auto"`` takes (`step_compilation`), ``fastest`` the
    faster measured one, so the rule is checked on every run.
    ``element_clusters`` marks a graph step whose element-wise ops this
    process' ``TF_XLA_FLAGS`` handed to XLA clusters.
    """
    clustered = keras.backend.backend() == "tensorflow" and element_clusters.in_effect()
    rows, matmuls = [], []
    for precision in precisions:
        compute_dtype = keras.DTypePolicy(precision).compute_dtype
        built, steps = {}, {}
        for jit in step_paths():
            steps[("matmul", jit)] = matmul_step(matmul, compute_dtype, jit)
            for name in models:
                built[(name, jit)], steps[(name, jit)] = _model_step(name, model_batch, precision, jit_compile=jit)
        seconds, compile_seconds = interleaved(steps, repeats)
        rates = {jit: 2 * matmul**3 / seconds[("matmul", jit)] / 1e9 for jit in step_paths()}
        matmuls += [
            {"precision": precision, "dtype": compute_dtype, "path": _path_name(jit), "gflops": rate, "beside": models}
            for jit, rate in rates.items()
        ]
        for name in models:
            fastest = min(step_paths(), key=lambda jit: seconds[(name, jit)])
            forward_gflops = model_gflops(built[(name, fastest)])  # the same model on either path
            rule = resolve_jit_compile("auto", precision, gflops_per_image=forward_gflops)
            for jit in step_paths():
                # Forward + backward ~ 3x the forward pass.
                gflops = 3 * forward_gflops * model_batch / seconds[(name, jit)]
                rows.append(
                    {
                        "model": name,
                        "precision": precision,
                        "path": _path_name(jit),
                        "element_clusters": clustered and not jit,
                        "batch": model_batch,
                        "step_ms": 1e3 * seconds[(name, jit)],
                        "images_per_second": model_batch / seconds[(name, jit)],
                        "compile_seconds": compile_seconds[(name, jit)],
                        "achieved_gflops": gflops,
                        "matmul_gflops": max(rates.values()),
                        "fraction_of_matmul": gflops / max(rates.values()),
                        "rule": jit == rule,
                        "fastest": jit == fastest,
                    }
                )
    return rows, matmuls


def run_benchmark(quick=False, output="bench.json", **overrides):
    """Runs (a) to (e); writes JSON to `output` and markdown tables beside it; returns the results."""
    settings = {**(QUICK if quick else FULL), **overrides}
    layer = layer_benchmark(**settings)
    models, matmul = model_step_benchmark(**settings)
    results = {
        "machine": machine(),
        "settings": json_settings(settings),
        "layer": layer,
        "models": models,
        "matmul": matmul,
        "model_memory": model_memory_benchmark(**settings),
        "formats": format_benchmark(**settings),
    }
    write_report(output, results, markdown_tables(results))
    return results


def run_step_benchmark(quick=False, output="bench-steps.json", **overrides):
    """Runs (b) and (c) alone (``attnconv bench --suite steps``): every model on every path, in every precision."""
    settings = {**(QUICK if quick else FULL), **overrides}
    check_precisions(settings["precisions"])
    for model in settings["models"]:
        get_model_config(model)  # an unknown name (with the closest ones) fails here, before anything is built
    models, matmul = steps_as_train_runs_them(settings)
    results = {"machine": machine(), "settings": json_settings(settings), "models": models, "matmul": matmul}
    write_report(output, results, step_markdown(results))
    return results


def clustered_step_groups(models, precisions, environ=None):
    """The steps suite's cases grouped as `attnconv train` would set ``TF_XLA_FLAGS`` for them: a list of
    (precision, models, whether their graph step takes element-wise XLA clusters), or None where no case takes
    them or `environ` (default: the process') has ``TF_XLA_FLAGS`` of its own, which train leaves as it is."""
    units = cpu_capabilities()["bfloat16_units"]
    takes = {
        (model, precision): element_clusters.train_sets_them(model, precision, units, environ)
        for precision in precisions
        for model in models
    }
    if not any(takes.values()):
        return None
    groups = []
    for precision in precisions:
        for clustered in (False, True):
            group = [model for model in models if takes[(model, precision)] == clustered]
            groups += [(precision, group, clustered)] if group else []
    return groups


def model_steps_case(**settings):
    """A worker's case: `model_step_benchmark` of `settings` under the worker's own ``TF_XLA_FLAGS``."""
    rows, matmuls = model_step_benchmark(**settings)
    return {"models": rows, "matmul": matmuls}


def steps_as_train_runs_them(settings):
    """`model_step_benchmark` with every graph step as `attnconv train` runs it.

    Train hands a mixed_bfloat16 attention model's graph step on a CPU with
    bfloat16 units to element-wise XLA clusters (`element_clusters`), by
    ``TF_XLA_FLAGS``, which TensorFlow reads once per process. So where some
    case takes them, each group of cases that shares the setting
    (`clustered_step_groups`) runs in a fresh worker process of its own, one
    at a time, each with its own matmul reference; elsewhere everything runs
    here, side by side, as before.
    """
    groups = clustered_step_groups(settings["models"], settings["precisions"])
    if groups is None:
        return model_step_benchmark(**settings)
    rows, matmuls = [], []
    for precision, models, clustered in groups:
        environment = element_clusters.worker_environment(clustered)
        case = {**settings, "models": models, "precisions": [precision]}
        (result,) = run_in_workers("model-steps", [case], concurrently=False, environment=environment)
        if any(row["element_clusters"] != (clustered and row["path"] == "graph") for row in result["models"]):
            raise RuntimeError(f"a worker's TF_XLA_FLAGS did not take: {result['models']} for {case}")
        rows += result["models"]
        matmuls += result["matmul"]
    return rows, matmuls


def step_markdown(results):
    """The machine and the training-step table of a `run_step_benchmark` result."""
    return f"Machine: {machine_text(results['machine'])}.\n\n{model_step_table(results)}"


_COMPARISON_TITLES = {
    "separable": "quadratic position-only heads, separable row/column passes vs the general (heads, T, T) path",
    "window7": "content attention (key_dim = hidden), 7x7 neighbourhood vs global attention; difference against "
    "global attention with the window as a mask",
}


def _mib(value):
    """A MiB figure for the tables; "-" where the backend did not report it (no XLA)."""
    return "-" if value is None else f"{value:.0f}"


def _ratio(baseline, fast):
    return "-" if baseline is None or fast is None else f"{baseline / fast:.1f}x"


def _options_text(options):
    return ", ".join(f"{key}={value}" for key, value in (options or {}).items()) or "as registered"


def markdown_tables(results):
    m = results["machine"]
    settings = results["settings"]
    lines = [
        f"Machine: {machine_text(m)}, Keras {m['keras']} on {m['backend']}. "
        f"Medians of {settings['repeats']} rounds; in each round the compared steps run one after the other.",
    ]
    for name in settings["comparisons"]:
        lines += [
            "",
            f"Attention layer ({settings['heads']} heads, hidden {settings['hidden']}, "
            f"batch {settings['layer_batch']}), forward + backward, XLA: {_COMPARISON_TITLES[name]}. "
            "Step MiB: what XLA assigned to the compiled step (its buffer assignment).",
            "",
            "| tokens | fast path | fast ms | baseline ms | speed-up | fast step MiB | baseline step MiB "
            "| memory ratio | max abs diff |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in results["layer"]:
            if row["comparison"] == name:
                lines.append(
                    f"| {row['tokens']} | {row['fast_mode']} | {row['fast_ms']:.1f} "
                    f"| {row['baseline_ms']:.1f} "
                    f"| {row['speedup']:.2f}x | {_mib(row['fast_step_mib'])} "
                    f"| {_mib(row['baseline_step_mib'])} "
                    f"| {_ratio(row['baseline_step_mib'], row['fast_step_mib'])} "
                    f"| {row['max_abs_difference']:.1e} |"
                )
    lines += ["", model_step_table(results)]
    lines += [
        "",
        f"Training at {settings['memory_image_size']}x{settings['memory_image_size']} input images "
        "(float32, XLA, 3 steps): the compiled step's memory, and the peak resident memory of the whole "
        "process (framework and compilation included):",
        "",
        "| model | options | batch | step MiB | process peak MiB |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| `{row['model']}` | {_options_text(row.get('options'))} | {row['batch']} "
        f"| {_mib(row.get('step_mib'))} | {row['peak_memory_mib']:.0f} |"
        for row in results["model_memory"]
    ]
    lines += ["", formats_markdown(results["formats"], settings["repeats"])]
    return "\n".join(lines)


def _matmul_rate(row, matmuls):
    """A matmul's rate for the steps table's text, with the models measured beside it where its dtype and path
    were measured more than once (in several workers)."""
    repeated = sum((other["dtype"], other["path"]) == (row["dtype"], row["path"]) for other in matmuls) > 1
    beside = f" (beside {', '.join(row['beside'])})" if repeated and row.get("beside") else ""
    return f"{row['dtype']} {row['path']} {row['gflops']:.0f}{beside}"


def model_step_table(results):
    """The training steps on each path, with the same run's matmul rates (`model_step_benchmark`)."""
    settings = results["settings"]
    n = settings["matmul"]
    rates = "; ".join(_matmul_rate(row, results["matmul"]) for row in results["matmul"])
    clustered = any(row.get("element_clusters") for row in results["models"])
    groups = (
        " As `attnconv train` runs them, the graph steps marked + clusters ran with their element-wise ops in "
        "XLA clusters (keras_attnconv/models/element_clusters.py), which a process sets once: each group of "
        "models that shares that setting ran in a worker process of its own, with its own matmul, and its "
        "rows' figures are against that matmul."
        if clustered
        else ""
    )
    lines = [
        f"Training step (batch {settings['model_batch']}) on each path (xla: XLA; graph: TensorFlow's "
        f"graph, oneDNN on a CPU), in turns with a {n}x{n} matmul in each precision's compute dtype on "
        f"each path (GFLOP/s: {rates}). Of matmul: the step's GFLOP/s over the best matmul rate of its "
        'precision. Rule: the path `jit_compile="auto"` takes (keras_attnconv/models/'
        f"step_compilation.py); fastest: the faster path of the two, measured here.{groups}",
        "",
        "| model | precision | path | step ms | images/s | GFLOP/s | of matmul | rule | fastest | step vs resnet |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    resnet = {(r["precision"], r["path"]): r["step_ms"] for r in results["models"] if r["model"].startswith("resnet")}
    for row in results["models"]:
        resnet_ms = resnet.get((row["precision"], row["path"]))  # None where the run left ResNet out (--models)
        ratio = "-" if resnet_ms is None else f"{row['step_ms'] / resnet_ms:.2f}x"
        lines.append(
            f"| `{row['model']}` | {row['precision']} | {path_label(row)} | {row['step_ms']:.0f} "
            f"| {row['images_per_second']:.1f} | {row['achieved_gflops']:.1f} "
            f"| {100 * row['fraction_of_matmul']:.0f}% | {'yes' if row['rule'] else ''} "
            f"| {'yes' if row['fastest'] else ''} | {ratio} |"
        )
    targets = targets_markdown(results["models"], (results["machine"].get("cpu") or {}).get("bfloat16_units"))
    return "\n".join(lines + (["", targets] if targets else []))
