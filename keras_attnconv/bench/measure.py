"""How the benchmarks measure: time in turns, peak memory, one fresh worker process per case, the device.

Only `keras`, `keras.ops` and NumPy (and the backend's own memory counters)
are used, so every suite runs on any backend, with or without TensorFlow.
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

from keras_attnconv.utils import machine


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


def reset_process_peak():
    """Resets VmHWM to the current RSS (Linux 4.0+); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def process_peak_rise_mib(step, calls=2):
    """Rise of the process' peak resident set (MiB) over `calls` calls of an already compiled `step`."""
    if reset_process_peak():
        baseline = _memory_kib("VmRSS")
        for _ in range(calls):
            step()
        return (_memory_kib("VmHWM") - baseline) / 1024
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(calls):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline) / 1024


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


def device_description():
    """The device the backend computes on, the backend's version and the machine (for results files)."""
    backend = keras.backend.backend()
    description = {**machine(), "numpy": np.__version__}
    if backend == "jax":
        import jax
        import jaxlib

        device = jax.local_devices()[0]
        description.update(device=f"{device.device_kind} ({device.platform})", jax=jax.__version__,
                           jaxlib=jaxlib.__version__)
    elif backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else None
        description.update(device=f"{name} (gpu)" if gpus else f"{platform.processor() or 'CPU'} (cpu)",
                           tensorflow=tf.__version__)
    else:
        description["device"] = "unknown"
    return description


def matmul_step(n, dtype):
    """An n x n matmul in `dtype` (2 n^3 FLOPs) that waits for its result: the device's reference rate."""
    a = ops.cast(ops.convert_to_tensor(np.random.default_rng(0).normal(size=(n, n)).astype("float32")), dtype)
    return lambda: ops.convert_to_numpy(ops.matmul(a, a)[0, 0])


def run_in_workers(kind, cases, concurrently):
    """Runs `python -m keras_attnconv.bench <kind> CASE` for each case in its own fresh process; their JSON results.

    A fresh process per case makes each peak memory the case's own and each
    compile time a cold one. Workers run all at once only where that cannot
    distort what they measure (memory on a CPU); on an accelerator one at a
    time, since they share it.
    """
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}

    def start(case):
        return subprocess.Popen([sys.executable, "-m", "keras_attnconv.bench", kind, json.dumps(case)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def result(case, worker):
        stdout, stderr = worker.communicate()
        if worker.returncode != 0:
            raise RuntimeError(f"benchmark worker failed for {case}:\n{stderr[-3000:]}")
        return json.loads(stdout.strip().splitlines()[-1])

    if concurrently:
        workers = [start(case) for case in cases]
        return [result(case, worker) for case, worker in zip(cases, workers)]
    return [result(case, start(case)) for case in cases]
