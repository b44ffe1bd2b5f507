"""The GPU plan suite: a GPU's training step compiled on a machine without one, and read as a roofline.

``attnconv bench --suite plan --models learned_content --precisions mixed_bfloat16``
compiles each model's training step (the one `model.fit` runs: SGD, a
from-logits loss, batch 100, 32x32x3, the paths the rules pick on a GPU,
`path_rule.paths_for`) for an NVIDIA H200 or H100 (``--target``) with XLA's device-less
compilation, then reads the compiled program (`hlo_roofline`): its kernels,
the bytes they move, its matmul FLOPs, the memory XLA assigned it, and its
floor at the target's measured rates. A change to a layer can so be judged
for a GPU by what XLA makes of it (transposes added or gone, bytes moved)
before a GPU is at hand; the GPU suite's and the profile's times on the
device stay the measure.

It needs JAX's CUDA plugin (``pip install "keras-attnconv[plan]"``, that is
``jax[cuda12]``: its compiler and libraries, no GPU and no driver) and the
JAX backend. Matmuls are left to cuBLAS (``--xla_gpu_enable_triton_gemm=false``): without a device XLA
cannot autotune between cuBLAS and its Triton kernels, and the profiles of
the lent H100/H200 ran cuBLAS' kernels. Each case compiles in a worker
process of its own, with JAX on the CPU platform.
"""

import dataclasses

from keras_attnconv.bench.hlo_roofline import kernel_costs, largest_kernels, roofline
from keras_attnconv.bench.measure import run_in_workers
from keras_attnconv.layers.path_rule import paths_for
from keras_attnconv.models import get_model_config
from keras_attnconv.models.precision import check_precisions
from keras_attnconv.utils.reports import write_report

PLAN_MODELS = ("quadratic", "learned", "learned_content", "resnet18")
PLAN_PRECISIONS = ("mixed_bfloat16",)
# XLA's GPU target description (a GpuTargetConfigProto) of each chip, the memory bandwidth and size the data sheet's:
# XLA's cost model decides fusions and the schedule with them, so a plan is its target's (docs/performance.md: the
# H100's and the H200's fuse the scores' softmax differently).
_TARGET_CONFIG = """gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth} l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: {memory} shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 }} registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
runtime_version {{ major: 12 minor: 8 }}
device_description_str: "{name}"
"""


@dataclasses.dataclass(frozen=True)
class Target:
    """A GPU the plan compiles for, with the rates the GPU suite measured on it (its results file)."""

    name: str
    bandwidth: int  # bytes/s, the data sheet's
    memory: int  # bytes
    matmul_tflops: dict  # compute dtype -> the GPU suite's 8192x8192 matmul rate
    read_gbps: float  # the GPU suite's read of 1 GiB
    rates_from: str  # the results file the rates are copied from (a test holds them to it)

    def config(self):
        return _TARGET_CONFIG.format(bandwidth=self.bandwidth, memory=self.memory, name=self.name)


TARGETS = {
    "h200": Target(
        "NVIDIA H200",
        4_800_000_000_000,
        141_000_000_000,
        {"bfloat16": 541.3, "float16": 546.2, "float32": 322.4},
        2878.0,
        "training/results/gpu-h200-quadratic.json",
    ),
    "h100": Target(
        "NVIDIA H100 80GB HBM3",
        3_352_320_000_000,
        84_929_347_584,
        {"bfloat16": 580.8, "float16": 553.6, "float32": 334.7},
        2153.0,
        "training/results/gpu-h100.json",
    ),
}
_COMPUTE_DTYPE = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16", "float32": "float32"}


def _built(model, precision, batch, image_size):
    """The model compiled as the GPU suite compiles it (call inside `paths_for`), its attention path, and a batch of
    its data."""
    import keras

    from keras_attnconv.bench.gpu_suite import build_case_model

    built, path = build_case_model(model, precision, image_size)
    built.optimizer.build(built.trainable_variables)
    data = (
        keras.ops.zeros((batch, image_size, image_size, 3), "uint8"),
        keras.ops.zeros((batch,), "int32"),
        keras.ops.ones((batch,)),  # every image weighs 1, as in the GPU suite's steps
    )
    built._symbolic_build(data_batch=data)
    return built, path, data


def plan_case(model, precision, target, batch, image_size, **_):
    """Worker: one training step compiled for `target` without the device, read as a roofline."""
    import jax
    from jax.experimental import topologies

    chip = TARGETS[target]
    topology = topologies.get_topology_desc(platform="cuda", target_config=chip.config(), topology="1x1x1")
    mesh = topologies.make_mesh(topology, (1,), ("devices",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def on_target(array):
        return jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=replicated)

    with paths_for("gpu"):  # the paths the rules pick on the GPU, traced here
        built, path, data = _built(model, precision, batch, image_size)
        state = (
            [v.value for v in built.trainable_variables],
            [v.value for v in built.non_trainable_variables],
            [v.value for v in built.optimizer.variables],
            [v.value for m in built.metrics for v in m.variables],
        )
        lowered = jax.jit(built.train_step, donate_argnums=0).lower(
            jax.tree.map(on_target, state), jax.tree.map(on_target, data)
        )
    compiled = lowered.compile()
    costs = kernel_costs(compiled.as_text())
    rates = (chip.read_gbps, chip.matmul_tflops[_COMPUTE_DTYPE[precision]])
    memory = compiled.memory_analysis()
    return {
        "model": model,
        "precision": precision,
        "path": path,
        **roofline(costs, *rates),
        "step_mib": None if memory is None else memory.temp_size_in_bytes / 2**20,
        "largest": largest_kernels(costs, *rates),
    }


def run_plan(quick=False, output="bench-plan.json", models=None, precisions=None, target="h200", command=None):
    """Compiles each (model, precision) for `target` in a worker and writes JSON and markdown."""
    if target not in TARGETS:
        raise ValueError(f"`target` must be one of {sorted(TARGETS)}. Received: target={target!r}")
    models = tuple(models or (("quadratic_tiny",) if quick else PLAN_MODELS))
    precisions = tuple(precisions or PLAN_PRECISIONS)
    batch, image_size = (8, 8) if quick else (100, 32)
    check_precisions(precisions)
    for model in models:  # an unknown name fails here, with the closest ones, not in a worker
        get_model_config(model, image_size=image_size)
    cases = [
        {"model": m, "precision": p, "target": target, "batch": batch, "image_size": image_size}
        for m in models
        for p in precisions
    ]
    environment = {
        "KERAS_BACKEND": "jax",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false",
    }
    _check_cuda_plugin()
    rows = run_in_workers("plan-case", cases, concurrently=False, environment=environment)
    chip = TARGETS[target]
    results = {
        "command": command,
        "target": {"name": chip.name, "read_gbps": chip.read_gbps, "matmul_tflops": chip.matmul_tflops},
        "rates_from": chip.rates_from,
        "settings": {"batch": batch, "image_size": image_size},
        "rows": rows,
    }
    write_report(output, results, plan_markdown(results))
    return results


def _check_cuda_plugin():
    """RuntimeError saying what to install when JAX's CUDA plugin is missing."""
    import importlib.util

    if not any(importlib.util.find_spec(name) for name in ("jax_cuda12_plugin", "jax_cuda13_plugin")):
        raise RuntimeError(
            'The plan suite compiles for a GPU with JAX\'s CUDA plugin: pip install "jax[cuda12]" '
            '(or "keras-attnconv[plan]"; no GPU needed). It is not installed here.'
        )


def plan_markdown(results):
    """The plan as markdown: one row per case, then each case's largest kernels."""
    target = results["target"]
    rates = ", ".join(f"{dtype} {rate:.0f}" for dtype, rate in target["matmul_tflops"].items())
    lines = [
        f"Compiled for an {target['name']} without one (matmul TFLOP/s {rates}; read {target['read_gbps']:.0f} "
        f"GB/s, from `{results['rates_from']}`), batch {results['settings']['batch']}.",
        "",
        "| model | path | precision | kernels | GB moved | matmul and conv TFLOP | floor ms | step MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        lines.append(
            f"| `{row['model']}` | {row['path'] or '-'} | {row['precision']} | {row['kernels']} | "
            f"{row['gbytes']:.2f} | {row['tflop']:.3f} | {row['floor_ms']:.2f} | {row['step_mib']:.0f} |"
        )
    for row in results["rows"]:
        lines += ["", f"Largest kernels of `{row['model']}` ({row['precision']}):", ""]
        lines += ["| floor us | MB | GFLOP | kind | result | op |", "|---|---|---|---|---|---|"]
        for kernel in row["largest"]:
            lines.append(
                f"| {kernel['floor_us']:.0f} | {kernel['bytes'] / 1e6:.1f} | {kernel['flops'] / 1e9:.1f} | "
                f"{kernel['kind']} | `{kernel['shape']}` | {'/'.join(kernel['source'].split('/')[-3:]) or '-'} |"
            )
    return "\n".join(lines) + "\n"
