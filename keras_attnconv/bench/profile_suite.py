"""The profile suite of `attnconv bench --suite profile`: where a training step's time goes.

For each precision and path (XLA; TensorFlow's graph, oneDNN on a CPU), in a
worker process of its own, the backend's profiler (TensorFlow's, or JAX's,
where every step is XLA) records `repeats` training steps of one model (the
quadratic one, or the one `--models` names) after `warmup` steps. The graph
step runs as `attnconv train` runs it: with the element-wise XLA clusters
where train sets them (`element_clusters`). On a GPU only the device's kernels are counted (the host's
launches of them would count twice), and their sum beside the step's time
is how busy the device kept. Every event of the trace gets its
self time (its duration less that of the events nested in it on the same
thread); an event that is a framework's (an executor, a thread pool's
`ParallelFor`, Python waiting for the step) gives its self time to the op it
runs inside, or else to "framework and waiting". Ops are grouped by kind:
TensorFlow's op type (`MatMul`, `StatelessRandomUniformV2`, ...) or XLA's
operation name without its number (`MatMul`, `loop_multiply_fusion`, ...).
The table gives each kind's share of the op time, and how much of it is
matmuls and convolutions, random numbers (dropout's masks) and the rest.

This is what the training step's fraction of the matmul rate is made of
(`attnconv bench --suite steps`): the time not in matmuls, and which ops
hold it.
"""

import collections
import glob
import os
import re
import tempfile
import time
import typing

import keras
import numpy as np

from keras_attnconv.bench.measure import path_label, random_images, run_in_workers
from keras_attnconv.models import build_model, element_clusters, get_model_config
from keras_attnconv.models.precision import check_precisions
from keras_attnconv.utils.reports import (
    cpu_capabilities,
    device_description,
    json_settings,
    machine,
    machine_text,
    write_report,
)

PROFILE_FULL = {
    "model": "quadratic",
    "precisions": ("float32", "mixed_bfloat16"),
    "paths": ("xla", "graph"),
    "batch": 16,
    "image_size": 32,
    "warmup": 2,
    "repeats": 3,
    "top": 12,
}
# A GPU (JAX): the GPU suite's batch, the recipes' precision first, every step XLA.
PROFILE_GPU = {
    **PROFILE_FULL,
    "precisions": ("mixed_bfloat16", "float32"),
    "paths": ("xla",),
    "batch": 100,
    "warmup": 5,
    "repeats": 10,
    "top": 15,
}
# Tiny shapes, a smoke test of the profile and its parsing (it runs in the CPU test suite): not a measurement.
PROFILE_QUICK = {
    "model": "quadratic_tiny",
    "precisions": ("float32",),
    "paths": ("xla", "graph"),
    "batch": 2,
    "image_size": 8,
    "warmup": 1,
    "repeats": 1,
    "top": 5,
}
JIT_COMPILE = {"xla": True, "graph": False}
FRAMEWORK = "framework and waiting"
# Kinds of op by what they compute (lower-cased substrings of the kind's name).
# A GPU's matmul kernels are named by their library: cuBLAS (gemm, xmma, nvjet) or CUTLASS.
# "convolution" and "conv2d", not "conv": XLA's `convert` fusions are element-wise casts.
CATEGORIES = {
    "matmul": (
        "matmul",
        "dot",
        "convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "einsum",
        "gemm",
        "xmma",
        "nvjet",
        "cutlass",
    ),
    "random": ("random", "rng", "philox"),
}
_FRAMEWORK_NAMES = {
    "one_step_on_data",
    "BlockUntilReady",
    "ParallelFor",
    "EagerCopyToDevice",
    "FunctionRun",
    "ValidateInputTypeAndPlacement",
    "shard_args",
}
# Executors, TensorFlow's C API, a compiled function's own event, XLA's marks of an operation's end,
# Python's frames (JAX's profiler names them "$file:line function") and JAX's call of a compiled function.
_FRAMEWORK_PREFIXES = ("__inference", "a_inference", "TFE_", "end: ", "$", "PjitFunction")


def is_framework_event(name):
    """Whether a trace event is the framework's (runs ops, or waits for them) rather than an op's."""
    return "::" in name or "Execute" in name or name.startswith(_FRAMEWORK_PREFIXES) or name in _FRAMEWORK_NAMES


def op_kind(name):
    """An op event's kind: TensorFlow's op type (after the ':'), or XLA's operation name without its numbers
    (``MatMul_1.180`` and ``MatMul.12`` are both ``MatMul``)."""
    return kernel_kind(name.rsplit(":", 1)[-1].strip())


def kernel_kind(name):
    """A device kernel's kind: its name without its numbers (``loop_add_fusion_3`` is ``loop_add_fusion``); a
    library's C++ kernel (``void cutlass::Kernel2<...>``) keeps its whole name."""
    return re.sub(r"(_\d+)?(\.\d+)?$", "", name)


def category(kind):
    """ "matmul", "random" or "other": what an op kind computes."""
    lowered = kind.lower()
    return next((name for name, parts in CATEGORIES.items() if any(part in lowered for part in parts)), "other")


def self_times_by_kind(lines, device_kernels=False):
    """Seconds of self time per op kind (and `FRAMEWORK`) over the threads' events.

    Args:
        lines: per thread, a list of ``(name, start_ps, duration_ps)`` events, nested like a call stack.
        device_kernels: whether the lines are a device's streams, whose events are all kernels and copies,
            one after the other: none is the framework's, though a C++ kernel's name holds the "::" that
            marks a framework's event on a host's thread.
    """
    totals = collections.Counter()
    if device_kernels:
        for events in lines:
            for name, _, duration in events:
                totals[kernel_kind(name)] += duration / 1e12
        return totals
    for events in lines:
        events = sorted(events, key=lambda e: (e[1], -e[2]))  # an enclosing event before the events in it
        self_ps = [duration for _, _, duration in events]
        owner = [None] * len(events)  # the index of the op event each event's self time belongs to
        stack = []  # (end_ps, index) of the events still open
        for index, (name, start, duration) in enumerate(events):
            while stack and stack[-1][0] <= start:
                stack.pop()
            parent = stack[-1][1] if stack else None
            if parent is not None:
                self_ps[parent] -= duration
            if not is_framework_event(name):
                owner[index] = index
            elif parent is not None:
                owner[index] = owner[parent]
            stack.append((start + duration, index))
        for index, seconds in enumerate(self_ps):
            kind = FRAMEWORK if owner[index] is None else op_kind(events[owner[index]][0])
            totals[kind] += max(seconds, 0) / 1e12
    return totals


def _trace_path(logdir):
    (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    return path


class Trace(typing.NamedTuple):
    """What a profile's trace holds for `self_times_by_kind`."""

    lines: list  # per line, its (name, start_ps, duration_ps) events
    line_names: list  # those lines' names (JAX's; None for TensorFlow's)
    device_kernels: bool  # whether the lines are a device's streams (`self_times_by_kind`)


def counted_lines(planes):
    """The lines of a JAX profile's planes whose events are counted, and whether they are a device's streams.

    Where a GPU's plane holds streams, their events alone (kernels and copies, in the order the device ran
    them: the host's launches of them would count twice); else every thread of the host.

    Args:
        planes: ``(plane name, lines)`` pairs; a line has a ``name`` and its ``events``.
    """
    gpu_streams = [
        line
        for name, lines in planes
        if name.startswith("/device:GPU")
        for line in lines
        if line.name.startswith("Stream")
    ]
    return (gpu_streams, True) if gpu_streams else ([line for _, lines in planes for line in lines], False)


def _jax_trace(logdir):
    """The `Trace` JAX's profiler wrote to `logdir`."""
    import jax

    # The profile's planes, lines and events are iterators, read once.
    profile = jax.profiler.ProfileData.from_file(_trace_path(logdir))
    lines, device_kernels = counted_lines([(plane.name, list(plane.lines)) for plane in profile.planes])
    events = [
        [(event.name, round(event.start_ns * 1e3), round(event.duration_ns * 1e3)) for event in line.events]
        for line in lines
    ]
    return Trace(events, sorted({line.name for line in lines}), device_kernels)


def _tensorflow_trace(logdir):
    """The `Trace` of TensorFlow's profile written to `logdir`: every thread's events."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = _trace_path(logdir)
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    lines = []
    for plane in space.planes:
        names = {key: metadata.name for key, metadata in plane.event_metadata.items()}
        for line in plane.lines:
            lines.append([(names.get(e.metadata_id, "?"), e.offset_ps, e.duration_ps) for e in line.events])
    return Trace(lines, None, False)


def _profiled_steps(step, repeats, logdir):
    """Runs `step` `repeats` times under the backend's profiler writing to `logdir`.

    Returns (seconds per step, the `Trace`).
    """
    if keras.backend.backend() == "jax":
        import jax

        with jax.profiler.trace(logdir):
            seconds = _timed(step, repeats)
        return seconds, _jax_trace(logdir)
    import tensorflow as tf

    tf.profiler.experimental.start(logdir)
    seconds = _timed(step, repeats)
    tf.profiler.experimental.stop()
    return seconds, _tensorflow_trace(logdir)


def _cpu_seconds():
    times = os.times()
    return times.user + times.system


def _cores_busy(step, repeats, least_seconds=1.0):
    """How many cores `step` keeps busy by the OS's count of the process's CPU time, the work of threads that
    record no trace events included (XLA's dots on Eigen's thread pool: the trace's op time leaves it out):
    over `repeats` unprofiled steps, and as many more as make `least_seconds`, since the OS counts CPU time in
    ticks of about 10 ms."""
    cpu_start, wall_start, count = _cpu_seconds(), time.perf_counter(), 0
    while count < repeats or time.perf_counter() - wall_start < least_seconds:
        step()
        count += 1
    return (_cpu_seconds() - cpu_start) / (time.perf_counter() - wall_start)


def _timed(step, repeats):
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats


def profile_case(model, precision, path, batch, image_size, warmup, repeats, **_):
    """One model's training step in one precision on one path under the backend's profiler. A worker's job."""
    keras.utils.set_random_seed(0)
    built = build_model(model, seed=0, dtype=precision, image_size=image_size)
    built.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=JIT_COMPILE[path],
    )
    x, y = random_images(batch, image_size), (np.arange(batch) % 10).astype("int32")
    for _ in range(warmup):
        built.train_on_batch(x, y)
    cores_busy = _cores_busy(lambda: built.train_on_batch(x, y), repeats)
    # The trace is read here and not kept: nothing is left behind outside the output the user chose.
    with tempfile.TemporaryDirectory(prefix="attnconv-profile-") as logdir:
        # train_on_batch returns the loss to the host: each step has finished when the next starts.
        step_seconds, trace = _profiled_steps(lambda: built.train_on_batch(x, y), repeats, logdir)
    seconds = self_times_by_kind(trace.lines, trace.device_kernels)
    return {
        "model": model,
        "precision": precision,
        "path": path,
        "step_ms": 1e3 * step_seconds,
        "kinds_ms": {kind: 1e3 * value / repeats for kind, value in seconds.most_common()},
        "trace_lines": trace.line_names,
        "device_kernels": trace.device_kernels,
        "cores_busy": cores_busy,
        "element_clusters": path == "graph" and element_clusters.in_effect(),  # the graph path is TensorFlow's
    }


def profile_settings(quick):
    """The suite's settings for this backend and device: JAX compiles every step with XLA (no graph path)."""
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        raise RuntimeError(
            f"the profile suite reads TensorFlow's or JAX's profiler: run it with KERAS_BACKEND="
            f"tensorflow or jax. Received: backend {backend!r}"
        )
    if backend == "tensorflow":
        return PROFILE_QUICK if quick else PROFILE_FULL
    import jax

    on_gpu = jax.default_backend() == "gpu"
    return {**(PROFILE_QUICK if quick else PROFILE_GPU if on_gpu else PROFILE_FULL), "paths": ("xla",)}


def run_profile(quick=False, output="bench-profile.json", models=None, **overrides):
    """Profiles every (precision, path) case, one worker at a time; writes JSON and a markdown table beside it.

    Args:
        models: None (the suite's model), or a sequence of one model name: a profile is of one model's step,
            minutes of a GPU with its precisions.
        **overrides: settings replacing the suite's, e.g. ``precisions``.
    """
    if models is not None:
        if len(models) != 1:
            raise ValueError(
                "`models` must name one model: the profile suite profiles one model's step a run. "
                f"Received: models={','.join(models)!r}"
            )
        overrides["model"] = models[0]
    settings = json_settings({**profile_settings(quick), **overrides})
    get_model_config(settings["model"], image_size=settings["image_size"])  # an unknown name: the closest ones
    check_precisions(settings["precisions"])
    units = cpu_capabilities()["bfloat16_units"]
    rows = []
    for precision in settings["precisions"]:
        for path in settings["paths"]:
            # The graph step as `attnconv train` runs it: with the element-wise clusters where train sets them.
            clustered = path == "graph" and element_clusters.train_sets_them(settings["model"], precision, units)
            case = {**settings, "precision": precision, "path": path}
            environment = element_clusters.worker_environment(True) if clustered else None
            (row,) = run_in_workers("profile-case", [case], concurrently=False, environment=environment)
            if row["element_clusters"] != clustered:
                raise RuntimeError(f"a worker's TF_XLA_FLAGS did not take: {row['element_clusters']} for {case}")
            rows.append(row)
    results = {"machine": machine(), "device": device_description(), "settings": settings, "rows": rows}
    write_report(output, results, profile_markdown(results))
    return results


def shares(row):
    """The op time per step (ms, framework and waiting left out) and each category's share of it."""
    ops_ms = {kind: ms for kind, ms in row["kinds_ms"].items() if kind != FRAMEWORK}
    total = sum(ops_ms.values())
    by_category = collections.Counter()
    for kind, ms in ops_ms.items():
        by_category[category(kind)] += ms
    return total, {name: by_category[name] / total for name in (*CATEGORIES, "other")}


def profile_markdown(results):
    settings, device = results["settings"], results.get("device", {}).get("device", "")
    on_device = any(row.get("device_kernels") for row in results["rows"])  # what was read, not where it ran
    op_time = (
        "the device's kernels' time per step (when the device was busy)"
        if on_device
        else "the ops' self time per step summed over threads (framework and waiting left out)"
    )
    lines = [
        f"Machine: {machine_text(results['machine'])}"
        + (f"; device: {device}" if on_device else "")
        + f"; Keras {results['machine']['keras']} on {results['machine']['backend']}.",
        "",
        f"`{settings['model']}`, batch {settings['batch']}, {settings['image_size']}x{settings['image_size']}"
        f"x3, {settings['repeats']} training steps profiled after {settings['warmup']}. Op ms: {op_time}.",
        "",
        "| precision | path | step ms | op ms | matmul | random | other | framework and waiting ms "
        "| CPU cores busy (OS) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        total, share = shares(row)
        cores = "-" if row.get("cores_busy") is None else f"{row['cores_busy']:.2f}"  # not measured before
        lines.append(
            f"| {row['precision']} | {path_label(row)} | {row['step_ms']:.1f} | {total:.1f} "
            + "".join(f"| {100 * share[name]:.0f}% " for name in share)
            + f"| {row['kinds_ms'].get(FRAMEWORK, 0.0):.1f} | {cores} |"
        )
    for row in results["rows"]:
        total, _ = shares(row)
        lines += [
            "",
            f"{row['precision']}, {path_label(row)}: the {settings['top']} largest op kinds",
            "",
            "| op kind | ms per step | share |",
            "|---|---|---|",
        ]
        # Largest first, whatever order the file kept (JSON is written with sorted keys).
        kinds = sorted(
            ((kind, ms) for kind, ms in row["kinds_ms"].items() if kind != FRAMEWORK), key=lambda item: -item[1]
        )[: settings["top"]]
        lines += [f"| `{kind}` | {ms:.2f} | {100 * ms / total:.1f}% |" for kind, ms in kinds]
    return "\n".join(lines)
