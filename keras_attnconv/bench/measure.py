"""How the benchmarks measure: time in turns, peak memory, one fresh worker process per case, the device.

Only `keras`, `keras.ops` and NumPy (and the backend's own memory counters)
are used, so every suite runs on any backend, with or without TensorFlow.
"""

import glob
import json
import os
import pathlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np
from keras import ops


def interleaved(steps, repeats, warmup=0):
    """Median seconds of each of `steps` (name -> callable), measured in turns.

    Each step is called once first (that call compiles; its time is returned
    too) and `warmup` more times untimed, then all steps run one after the
    other, `repeats` rounds: a machine that slows down or speeds up mid-run
    affects every step alike, so the ratios between them hold even when
    absolute times drift.
    """
    times = {name: [] for name in steps}
    compile_seconds = {}
    for name, step in steps.items():
        start = time.perf_counter()
        step()
        compile_seconds[name] = time.perf_counter() - start
        for _ in range(warmup):
            step()
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}, compile_seconds


def _memory_kib(field):
    """VmRSS / VmHWM (peak) of this process in KiB, from /proc (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(field)


_ALLOCATION_BYTES = re.compile(r"^allocation \d+: size (\d+)", re.MULTILINE)


def xla_dump_flags(directory):
    """XLA_FLAGS options that make XLA write the buffer assignment of every program it compiles to `directory`."""
    return f"--xla_dump_to={directory} --xla_dump_hlo_as_text"


def largest_program_mib(directory):
    """Memory (MiB) that XLA assigned to the largest program dumped in `directory`, or None if none was.

    XLA plans every buffer of a compiled program ahead of running it (its
    buffer assignment: the sizes of its allocations for arguments, outputs,
    constants and the temporaries at their peak, as packed; TensorFlow's XLA
    prints their sum as "Total bytes used"). For a compiled training step this
    is the step's own memory, exact and the same on every run: no allocator
    caching, no framework or compiler memory, which a process' resident set
    mixes in (TensorFlow keeps a compiled step's buffers between steps, so
    the resident set barely rises after the first step).
    """
    sizes = [
        sum(int(size) for size in _ALLOCATION_BYTES.findall(pathlib.Path(path).read_text()))
        for path in glob.glob(os.path.join(directory, "*buffer-assignment.txt"))
    ]
    return max(sizes) / 2**20 if sizes else None


def device_peak_memory():
    """(peak MiB, what it counts) of this process: the accelerator allocator's peak, else the peak resident set.

    JAX's and PyTorch's device peaks cannot be reset per measurement, which is
    why each case runs in its own worker process.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        stats = jax.local_devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            return stats["peak_bytes_in_use"] / 2**20, "device allocator peak"
    elif backend == "tensorflow":
        import tensorflow as tf

        if tf.config.list_logical_devices("GPU"):
            return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20, "device allocator peak"
    elif backend == "torch":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.max_memory_allocated() / 2**20, "device allocator peak"
    try:
        # VmHWM belongs to this program's memory map, new at exec; ru_maxrss also counts the peak of
        # the parent process this worker was forked from (Linux keeps it across fork and exec).
        peak_kib = _memory_kib("VmHWM")
    except OSError:
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, the best elsewhere
    return peak_kib / 1024, "process peak resident set (no accelerator)"


def path_label(row):
    """A measured step's path as the tables write it: ``xla``, ``graph``, or ``graph + clusters`` where its
    element-wise ops ran in XLA clusters (`element_clusters`; rows written before that was recorded had none)."""
    return "graph + clusters" if row.get("element_clusters") else row["path"]


def random_images(count, image_size, seed=0):
    """`count` random uint8 images (count, image_size, image_size, 3): what the zoo's models take."""
    return np.random.default_rng(seed).integers(0, 256, (count, image_size, image_size, 3), dtype=np.uint8)


def compiled(function, jit_compile):
    """`function` compiled as a training step with `jit_compile` would be: XLA, or TensorFlow's graph where False.

    JAX compiles with XLA either way (its only compiler); other backends run it as it is.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=jit_compile)
    if backend == "jax":
        import jax

        return jax.jit(function)
    return function


def matmul_step(n, dtype, jit_compile=True):
    """An n x n matmul in `dtype` (2 n^3 FLOPs) that waits for its result: the device's reference rate.

    With `jit_compile`, through XLA; without, through TensorFlow's graph (oneDNN on a CPU), as `compiled`.
    """
    a = ops.cast(ops.convert_to_tensor(np.random.default_rng(0).normal(size=(n, n)).astype("float32")), dtype)
    # One float32 element comes back: NumPy has no bfloat16 of its own to convert a framework's into.
    product = compiled(lambda: ops.cast(ops.matmul(a, a)[0, 0], "float32"), jit_compile)
    return lambda: ops.convert_to_numpy(product())


def read_step(mib):
    """A sum over `mib` MiB of float32 (it reads every byte once, writes one number): the device's read bandwidth."""
    a = ops.convert_to_tensor(np.ones(mib * 2**18, dtype="float32"))
    total = compiled(lambda: ops.sum(a), jit_compile=True)
    return lambda: ops.convert_to_numpy(total())


def xla_cost(model, x, y):
    """XLA's count of one forward + backward pass of `model` on a batch: {"flops", "bytes_accessed"}; None off JAX.

    Read off the compiled program (its cost analysis), so it is the work of the path XLA took, not a formula:
    it puts a measured step beside the device's floor for that work.
    """
    if keras.backend.backend() != "jax":
        return None
    import jax

    def loss(trainable, non_trainable, x, y):
        logits, _ = model.stateless_call(trainable, non_trainable, x, training=True)
        return ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    arguments = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables], x, y)
    analysis = jax.jit(jax.grad(loss)).lower(*arguments).compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per device program
        analysis = analysis[0]
    return {"flops": float(analysis["flops"]), "bytes_accessed": float(analysis["bytes accessed"])}


def run_in_workers(kind, cases, concurrently, program_memory=False, environment=None):
    """Runs `python -m keras_attnconv.bench <kind> CASE` for each case in its own fresh process; their JSON results.

    A fresh process per case makes each peak memory the case's own and each
    compile time a cold one. Workers run all at once only where that cannot
    distort what they measure (memory on a CPU); on an accelerator one at a
    time, since they share it. With `program_memory`, each result also gets
    ``"program_mib"``: `largest_program_mib` of what the worker compiled
    (None where the backend does not compile with XLA). `environment` adds
    variables to the workers' (its ``XLA_FLAGS`` after the user's own); one
    it sets to None is taken out.
    """
    environment = dict(environment or {})
    flags = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), environment.pop("XLA_FLAGS", None)]))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **environment, **({"XLA_FLAGS": flags} if flags else {})}
    env = {name: value for name, value in env.items() if value is not None}
    dumps = tempfile.mkdtemp(prefix="attnconv-xla-") if program_memory else None

    def start(index, case):
        worker_env = dict(env)
        if program_memory:
            flags = xla_dump_flags(os.path.join(dumps, str(index)))
            worker_env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
        return subprocess.Popen(
            [sys.executable, "-m", "keras_attnconv.bench", kind, json.dumps(case)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=worker_env,
        )

    def result(index, case, worker):
        stdout, stderr = worker.communicate()
        if worker.returncode != 0:
            raise RuntimeError(f"benchmark worker failed for {case}:\n{stderr[-3000:]}")
        output = json.loads(stdout.strip().splitlines()[-1])
        if program_memory:
            output["program_mib"] = largest_program_mib(os.path.join(dumps, str(index)))
        return output

    try:
        if concurrently:
            workers = [start(index, case) for index, case in enumerate(cases)]
            return [result(index, case, worker) for index, (case, worker) in enumerate(zip(cases, workers))]
        return [result(index, case, start(index, case)) for index, case in enumerate(cases)]
    finally:
        if dumps is not None:
            shutil.rmtree(dumps, ignore_errors=True)
