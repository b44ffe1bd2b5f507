"""Whether a training step compiles with XLA: the rule behind ``jit_compile="auto"``, by device and precision.

A training step runs either whole under XLA (``jit_compile=True``) or as a
TensorFlow graph whose matmuls and convolutions go to oneDNN on a CPU
(``jit_compile=False``). Which is faster is a property of the device, and
it was measured (`attnconv bench --suite cpu`, which times both paths of
every model in every precision side by side and says where the rule's pick
was not the faster one):

- GPU and TPU: XLA, whole step (it fuses the element-wise work between the
  tensor-core matmuls; `attnconv bench --suite gpu` measures the models there).
- CPU, TensorFlow: the graph, in every precision. XLA's CPU backend computes
  bfloat16 matmuls without the CPU's bfloat16 units (AMX tiles, AVX-512 BF16
  dot products), which oneDNN uses: on an Intel Xeon with AMX a 2048x2048
  bfloat16 matmul ran at 298 GFLOP/s under XLA and 1,418 in the graph, and
  the quadratic model's mixed_bfloat16 step took 5,150 ms under XLA and 2,243
  in the graph (batch 50). In float32 the graph was faster too, less so:
  4,652 ms (XLA) vs 4,286 (graph) on that Xeon; on an AMD EPYC with AVX2 only
  (no bfloat16 units: `docs/performance.md` has the run) the graph was
  faster in both precisions.
- JAX: XLA (it is JAX's only compiler; without ``jit`` a step runs op by op).
- PyTorch: no XLA (Keras' own default there).

``True`` and ``False`` still force a path. `cpu_capabilities` names what a
CPU can do for bfloat16, for the benchmark reports and the run's log line.
"""

import keras

from keras_attnconv.utils.reports import cpu_capabilities



def check_jit_compile(jit_compile, argument="jit_compile"):
    """Raises ValueError naming `argument` unless `jit_compile` is True, False or ``"auto"``."""
    if not (isinstance(jit_compile, bool) or jit_compile == "auto"):
        raise ValueError(f"`{argument}` must be true, false or \"auto\" (the measured fastest path of this "
                         f"device). Received: {argument}={jit_compile!r}")


def uses_xla(platform, precision, backend, cpu_flags=frozenset()):
    """Whether a training step on `platform` in `precision` compiles with XLA under `backend` (the rule, untimed).

    Args:
        platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
        precision: the model's dtype policy name (the rule is the same for every one today; the argument is
            here because the measurements behind it were made per precision, and a new device may split them).
        backend: Keras' backend name.
        cpu_flags: the CPU's flags (`cpu_capabilities`); on a CPU they decide nothing today, for the same reason.
    """
    del precision, cpu_flags  # measured: the CPU's graph wins in every precision, with or without bf16 units
    if backend == "jax":
        return True
    if backend != "tensorflow":
        return False
    return platform in ("gpu", "tpu")


def resolve_jit_compile(jit_compile, precision="float32", platform=None, backend=None):
    """`jit_compile` as `keras.Model.compile` takes it: ``"auto"`` becomes this device's measured fastest path."""
    from keras_attnconv.layers.path_rule import checked_platform

    check_jit_compile(jit_compile)
    if jit_compile != "auto":
        return jit_compile
    return uses_xla(checked_platform(platform), precision, backend or keras.backend.backend(),
                    cpu_capabilities()["flags"])


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
