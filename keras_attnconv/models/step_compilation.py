"""Whether a training step compiles with XLA: the rule behind ``jit_compile="auto"``, by device and precision.

A training step runs either whole under XLA (``jit_compile=True``) or as a
TensorFlow graph whose matmuls and convolutions go to oneDNN on a CPU
(``jit_compile=False``). Which is faster is a property of the device, and
it is measured: `attnconv bench --suite steps` (part of the CPU suite)
times every model on both paths in both training precisions, side by side,
and marks where the rule's pick was not the faster one.

- GPU and TPU: XLA, whole step (it fuses the element-wise work between the
  tensor-core matmuls; `attnconv bench --suite gpu` measures the models there).

A CPU's rule, for a model of `SMALL_MODEL_GFLOPS` and more (smaller ones below):

- CPU with bfloat16 units, in a bfloat16 precision: the graph. XLA's CPU
  backend computes bfloat16 matmuls without the CPU's bfloat16 units (AMX
  tiles, AVX-512 BF16 dot products), which oneDNN uses: on an Intel Xeon
  with AMX a 2048x2048 bfloat16 matmul ran at 298 GFLOP/s under XLA and 1,418
  in the graph, and the quadratic model's mixed_bfloat16 step took 5,150 ms
  under XLA and 2,243 in the graph (batch 50). In the CPU suite on another
  Xeon with AMX (batch 16, `training/results/bench-cpu-amx.md`): 1,529 ms
  against 757, and the graph 1.76-2.20x faster for every model measured.
- CPU with AMX, in float32: the graph as well (4,286 ms against XLA's 4,652
  for that step on that Xeon; 1,292 against 1,417 in the CPU suite, and
  1.03-1.30x faster for every model measured there).
- Any other CPU: XLA. On an AMD EPYC with AVX2 and no bfloat16 units
  (`training/results/bench-steps-cpu.md`, batch 16) XLA was faster for four
  of the five models in float32 (up to 1.5x: ResNet-18, 862 ms vs 1,294; the
  fifth, `learned`, 16% slower) and in mixed_bfloat16 (the fifth even),
  where oneDNN, without bfloat16 units, took up to 17x as long
  (`learned_content_local`: 11.1 s under XLA, 187 s in the graph).
- Any CPU, a model of under `SMALL_MODEL_GFLOPS` forward FLOPs per image
  (`count_flops`, attention included): XLA. Its step is many small ops,
  which XLA fuses and TensorFlow's graph runs one by one. On the Xeon with
  AMX (batch 16; `training/results/bench-steps-cpu-amx-sizes.md`) XLA was
  1.35x faster than the graph for `quadratic_tiny` (0.05 GFLOP per image)
  in float32 and 1.2x in mixed_bfloat16, 1.26x for `learned_content_tiny`
  (0.31) in float32 and as fast in mixed_bfloat16, while the graph was 1.3x
  and 1.7x faster for `resnet10` (0.51) and faster for every paper model
  (1.11 GFLOP and more; `training/results/bench-cpu-amx.md`);
  the quick recipe (`quadratic_tiny`, batch 50, float32) trained at 568 and
  586 images/s under XLA against 464 and 468 in the graph. A model whose
  size is not given is ruled as a large one.

Other backends, on any device:

- JAX: XLA (it is JAX's only compiler; without ``jit`` a step runs op by op).
- PyTorch: no XLA (Keras' own default there).

An AVX-512 BF16 CPU without AMX is ruled by its bfloat16 units (the graph
in bfloat16, XLA in float32) but was not measured on both paths yet.

``True`` and ``False`` still force a path. `cpu_capabilities` names what a
CPU can do for bfloat16, for the benchmark reports and the run's log line.
"""

import keras

from keras_attnconv.models.flops import count_flops
from keras_attnconv.utils.reports import BFLOAT16_UNITS, cpu_capabilities

# Forward GFLOP per image below which a CPU's step takes XLA whatever the CPU (module docstring): between the
# largest model measured faster under XLA on the Xeon with AMX (0.31) and the smallest faster in the graph (0.51).
SMALL_MODEL_GFLOPS = 0.4


def check_jit_compile(jit_compile, argument="jit_compile"):
    """Raises ValueError naming `argument` unless `jit_compile` is True, False or ``"auto"``."""
    if not (isinstance(jit_compile, bool) or jit_compile == "auto"):
        raise ValueError(f"`{argument}` must be true, false or \"auto\" (the measured fastest path of this "
                         f"device). Received: {argument}={jit_compile!r}")


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
    if gflops_per_image is not None and gflops_per_image < SMALL_MODEL_GFLOPS:
        return True  # many small ops: XLA fuses them, the graph runs them one by one
    if keras.DTypePolicy(precision).compute_dtype == "bfloat16" and cpu_flags & set(BFLOAT16_UNITS):
        return False  # oneDNN computes on the bfloat16 units; XLA's CPU backend does not
    return "amx_bf16" not in cpu_flags  # measured: the graph on AMX machines, XLA elsewhere


def resolve_jit_compile(jit_compile, precision="float32", platform=None, backend=None, gflops_per_image=None):
    """`jit_compile` as `keras.Model.compile` takes it: ``"auto"`` becomes this device's measured fastest path
    for a model of `gflops_per_image` (`model_gflops`; None: unknown)."""
    from keras_attnconv.layers.path_rule import checked_platform

    check_jit_compile(jit_compile)
    if jit_compile != "auto":
        return jit_compile
    return uses_xla(checked_platform(platform), precision, backend or keras.backend.backend(),
                    cpu_capabilities()["flags"], gflops_per_image)


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
    units = cpu_capabilities()["bfloat16_units"]
    return f"TensorFlow graph (oneDNN; bfloat16 units: {units or 'none'})"
