"""Benchmarks behind `attnconv bench`, everything measured side by side in one run.

- `run_benchmark` (the CPU suite, `cpu_suite`): the attention layer's
  separable vs general paths, and the models' training steps against
  ResNet-18 and a matmul.
- `run_step_benchmark` (`attnconv bench --suite steps`, also part of the
  CPU suite): each model's training step on each path (XLA; TensorFlow's
  graph) in each precision, with the same run's matmul rates: what the
  `jit_compile="auto"` rule (`keras_attnconv.models.step_compilation`)
  stands on.
- `run_clusters_benchmark` (`attnconv bench --suite clusters`,
  `clusters_suite`): each model's graph step without and with element-wise
  XLA clusters, in fresh processes in turns (TensorFlow reads the flags at
  start): what `attnconv train` sets on CPUs with bfloat16 units stands on.
- `run_gpu_benchmark` (`attnconv bench --suite gpu`, `gpu_suite`): the
  paper's models at batch 100 in three precisions on an accelerator: step
  time, `fit` throughput, peak device memory, TFLOP/s against a matmul.
- `run_scale_benchmark` (`attnconv bench --suite scale`, `scale_suite`):
  training images per second with Keras' `DataParallel` over 1, 2, 4, ...
  devices (JAX), the global batch fixed.
- `run_profile` (`attnconv bench --suite profile`, `profile_suite`): where
  a training step's time goes, by op kind, from TensorFlow's profiler (on
  each path) or JAX's (XLA; on a GPU, its kernels), in each precision.
- `run_plan` (`attnconv bench --suite plan`, `plan_suite`): a training
  step compiled for an H200 or H100 on a machine without one, read as a
  roofline (`hlo_roofline`): kernels, bytes moved, matmul FLOPs, floor.
- `run_format_benchmark` (`attnconv bench --suite formats`, `formats`, also
  part of the CPU suite): inference in Keras, TensorFlow (SavedModel),
  onnxruntime and LiteRT, batch 1 and batch 64.

The numerics suite (`attnconv bench --suite numerics`) trains, so it is the
application's: `keras_attnconv.training.numerics`. `measure` holds how things
are measured (time in turns, peak memory, a fresh worker process per case).
Only `keras.ops` and NumPy are used: the suites run on any backend, and
without TensorFlow (the format benchmark then says that it needs TensorFlow).
"""

from keras_attnconv.bench.clusters_suite import (
    CLUSTERS_FULL,
    CLUSTERS_QUICK,
    clusters_markdown,
    run_clusters_benchmark,
)
from keras_attnconv.bench.cpu_suite import (
    FULL,
    QUICK,
    markdown_tables,
    run_benchmark,
    run_step_benchmark,
    step_markdown,
)
from keras_attnconv.bench.formats import FORMATS_FULL, FORMATS_QUICK, formats_markdown, run_format_benchmark
from keras_attnconv.bench.gpu_suite import GPU_FULL, GPU_QUICK, gpu_markdown, run_gpu_benchmark
from keras_attnconv.bench.plan_suite import PLAN_MODELS, TARGETS, plan_markdown, run_plan
from keras_attnconv.bench.profile_suite import PROFILE_FULL, PROFILE_QUICK, profile_markdown, run_profile
from keras_attnconv.bench.scale_suite import SCALE_FULL, SCALE_QUICK, run_scale_benchmark, scale_markdown

__all__ = [
    "CLUSTERS_FULL",
    "CLUSTERS_QUICK",
    "FORMATS_FULL",
    "FORMATS_QUICK",
    "FULL",
    "PLAN_MODELS",
    "GPU_FULL",
    "GPU_QUICK",
    "PROFILE_FULL",
    "PROFILE_QUICK",
    "QUICK",
    "TARGETS",
    "SCALE_FULL",
    "SCALE_QUICK",
    "clusters_markdown",
    "formats_markdown",
    "gpu_markdown",
    "markdown_tables",
    "plan_markdown",
    "profile_markdown",
    "run_benchmark",
    "run_clusters_benchmark",
    "run_format_benchmark",
    "run_gpu_benchmark",
    "run_plan",
    "run_profile",
    "run_scale_benchmark",
    "run_step_benchmark",
    "scale_markdown",
    "step_markdown",
]
