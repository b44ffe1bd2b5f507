"""Whether a training step compiles with XLA: the rule behind ``jit_compile="auto"``, by device and precision.

A training step runs either whole under XLA (``jit_compile=True``) or as a
TensorFlow graph whose matmuls and convolutions go to oneDNN on a CPU
(``jit_compile=False``). Which is faster is a property of the device, and
it is measured: `attnconv bench --suite steps` times every model on both
paths in both training precisions, side by side, and marks where the rule's
pick was not the faster one.

The rule (`uses_xla`; `resolve_jit_compile_for` applies it to a model):

- JAX: XLA (it is JAX's only compiler; without ``jit`` a step runs op by op).
  PyTorch: no XLA (Keras' own default there).
- GPU and TPU: XLA, whole step (it fuses the element-wise work between the
  tensor-core matmuls).
- CPU with bfloat16 units (AMX tiles or AVX-512 BF16 dot products):
  TensorFlow's graph, in every precision (oneDNN computes bfloat16 on
  those units, which XLA's CPU backend does not use, and oneDNN's float32
  step was the faster one too), except for a small model: XLA under
  `SMALL_MODEL_GFLOPS` forward FLOPs per image (`count_flops`, attention
  included), under `SMALL_BFLOAT16_MODEL_GFLOPS` where it computes in
  bfloat16; its step is many small ops, which XLA fuses and TensorFlow's
  graph runs one by one.
- Any other CPU: XLA (oneDNN without bfloat16 units was slower in both
  precisions, many times slower in bfloat16).

``True`` and ``False`` still force a path. The measurements behind each
line are in docs/performance.md ("The training step's path").
`cpu_capabilities` names what a CPU can do for bfloat16, for the benchmark
reports and the run's log line.
"""

import keras

from keras_attnconv.models.flops import count_flops
from keras_attnconv.utils.reports import BFLOAT16_UNITS, cpu_capabilities

# Forward GFLOP per image below which a CPU's float32 step takes XLA whatever the CPU (module docstring): between
# the largest model measured faster under XLA (learned_content_tiny, 0.31) and the smallest faster in the graph
# (resnet10, 0.51), on the Xeon with AMX and on the EPYC with AVX-512 BF16 alike.
SMALL_MODEL_GFLOPS = 0.4
# The same for a step computing in bfloat16, where the graph's matmuls run on the bfloat16 units and its
# element-wise ops in XLA clusters (`element_clusters`): on the EPYC with AVX-512 BF16, XLA was faster for
# quadratic_tiny (0.047) and the graph for learned_content_local_tiny (0.122, 1.28x) and learned_content_tiny
# (0.31, 1.21x and 1.43x; a tie on the Xeon with AMX, before the clusters).
SMALL_BFLOAT16_MODEL_GFLOPS = 0.1


def check_jit_compile(jit_compile, argument="jit_compile"):
    """Raises ValueError naming `argument` unless `jit_compile` is True, False or ``"auto"``."""
    if not (isinstance(jit_compile, bool) or jit_compile == "auto"):
        raise ValueError(
            f'`{argument}` must be true, false or "auto" (the measured fastest path of this '
            f"device). Received: {argument}={jit_compile!r}"
        )


def uses_xla(platform, precision, backend, cpu_flags=frozenset(), gflops_per_image=None):
    """Whether a training step on `platform` in `precision` compiles with XLA under `backend` (the rule, untimed).

    Args:
        platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
        precision: the model's dtype policy name (its compute dtype is what matters).
        backend: Keras' backend name.
        cpu_flags: the CPU's flags (Linux's names: ``amx_bf16``, ``avx512_bf16``, ...; `cpu_capabilities`).
        gflops_per_image: the model's forward GFLOP per image (`model_gflops`), or None where unknown.
    """
    if backend == "jax":
        return True
    if backend != "tensorflow":
        return False
    if platform != "cpu":
        return True
    if not cpu_flags & set(BFLOAT16_UNITS):
        return True  # measured: XLA where oneDNN has no bfloat16 units, the graph where it has
    bfloat16 = keras.DTypePolicy(precision).compute_dtype == "bfloat16"
    small = SMALL_BFLOAT16_MODEL_GFLOPS if bfloat16 else SMALL_MODEL_GFLOPS
    return gflops_per_image is not None and gflops_per_image < small  # many small ops: XLA fuses them


def resolve_jit_compile(jit_compile, precision="float32", platform=None, backend=None, gflops_per_image=None):
    """`jit_compile` as `keras.Model.compile` takes it: ``"auto"`` becomes this device's measured fastest path
    for a model of `gflops_per_image` (`model_gflops`; None: unknown)."""
    from keras_attnconv.layers.path_rule import checked_platform

    check_jit_compile(jit_compile)
    if jit_compile != "auto":
        return jit_compile
    return uses_xla(
        checked_platform(platform),
        precision,
        backend or keras.backend.backend(),
        cpu_capabilities()["flags"],
        gflops_per_image,
    )


def resolve_jit_compile_for(model, jit_compile="auto", precision=None, platform=None):
    """`jit_compile` for `model`'s training step: ``"auto"`` is the rule for this device, `precision` (default:
    the model's own dtype policy) and the model's size (`model_gflops`)."""
    precision = precision or model.dtype_policy.name
    return resolve_jit_compile(jit_compile, precision, platform, gflops_per_image=model_gflops(model))


def model_gflops(model):
    """A functional model's forward GFLOP per image, attention included (`count_flops`): its size for the rule."""
    return count_flops(model).total / 1e9


def describe_step_path(jit_compile, platform=None):
    """What a compiled step runs on, for logs and reports: ``"XLA"`` or ``"TensorFlow graph (oneDNN, ...)"``."""
    from keras_attnconv.layers.path_rule import checked_platform

    if jit_compile:
        return "XLA"
    if keras.backend.backend() != "tensorflow":
        return f"{keras.backend.backend()} without jit"
    if checked_platform(platform) != "cpu":
        return "TensorFlow graph"
    from keras_attnconv.models import element_clusters

    units = cpu_capabilities()["bfloat16_units"]
    clusters = "; element-wise ops in XLA clusters" if element_clusters.in_effect() else ""
    return f"TensorFlow graph (oneDNN; bfloat16 units: {units or 'none'}{clusters})"
