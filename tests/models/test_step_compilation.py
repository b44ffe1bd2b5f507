"""The path rule of a training step (`keras_attnconv.models.step_compilation`): which compiler for which device,
CPU capability and precision, stated without timing anything (`attnconv bench --suite cpu` measures it)."""

import keras
import pytest

from keras_attnconv.layers.path_rule import default_platform
from keras_attnconv.models import build_model
from keras_attnconv.models.precision import POLICY_NAMES
from keras_attnconv.models.step_compilation import (
    SMALL_BFLOAT16_MODEL_GFLOPS,
    SMALL_MODEL_GFLOPS,
    describe_step_path,
    model_gflops,
    resolve_jit_compile,
    uses_xla,
)
from keras_attnconv.utils.reports import cpu_capabilities

CPU_KINDS = {
    "AMX": frozenset({"amx_bf16", "avx512_bf16", "avx512f", "avx2"}),
    "AVX-512 BF16": frozenset({"avx512_bf16", "avx512f", "avx2"}),
    "AVX2 only": frozenset({"avx2"}),
}


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "bfloat16"])
@pytest.mark.parametrize("cpu", ["AMX", "AVX-512 BF16"])
def test_a_bfloat16_step_runs_the_graph_on_a_cpu_with_bfloat16_units(cpu, precision):
    # oneDNN computes on AMX and AVX-512 BF16; XLA's CPU backend does not (measured on AMX: 2.3x).
    assert uses_xla("cpu", precision, "tensorflow", CPU_KINDS[cpu]) is False


@pytest.mark.parametrize("gflops_per_image", [None, 0.51, 6.53])
@pytest.mark.parametrize("precision", POLICY_NAMES)
@pytest.mark.parametrize("cpu", ["AMX", "AVX-512 BF16"])
def test_every_step_of_a_large_model_runs_the_graph_on_a_cpu_with_bfloat16_units(cpu, precision, gflops_per_image):
    # Measured: on AMX the graph faster for every model of 0.51 GFLOP per image and more, in both training
    # precisions; on AVX-512 BF16 for every one in mixed_bfloat16, and for four of six in float32.
    assert uses_xla("cpu", precision, "tensorflow", CPU_KINDS[cpu], gflops_per_image) is False


@pytest.mark.parametrize("precision", POLICY_NAMES)
@pytest.mark.parametrize("cpu", sorted(CPU_KINDS))
def test_a_small_models_step_is_xla_on_every_cpu(cpu, precision):
    # Measured on AMX: XLA up to 1.35x faster for models of 0.05-0.31 GFLOP per image (many small ops, fused); in
    # bfloat16 on AVX-512 BF16, for the smallest (0.047) only, the graph with its bfloat16 units from 0.12.
    bfloat16 = keras.DTypePolicy(precision).compute_dtype == "bfloat16"
    small = SMALL_BFLOAT16_MODEL_GFLOPS if bfloat16 else SMALL_MODEL_GFLOPS
    assert uses_xla("cpu", precision, "tensorflow", CPU_KINDS[cpu], gflops_per_image=0.047) is True
    assert uses_xla("cpu", precision, "tensorflow", CPU_KINDS[cpu], gflops_per_image=0.31) is (
        cpu == "AVX2 only" or not bfloat16
    )
    assert uses_xla("cpu", precision, "tensorflow", CPU_KINDS[cpu], gflops_per_image=small) is (cpu == "AVX2 only")


@pytest.mark.backend_independent  # FLOP counts of configurations
def test_the_size_threshold_lies_between_the_models_it_was_measured_on():
    # XLA was faster for learned_content_tiny (the largest such model measured), the graph for resnet10.
    largest_faster_under_xla, smallest_faster_in_the_graph = (
        model_gflops(build_model(name)) for name in ("learned_content_tiny", "resnet10")
    )
    assert largest_faster_under_xla < SMALL_MODEL_GFLOPS < smallest_faster_in_the_graph
    # In bfloat16 on AVX-512 BF16: XLA faster for quadratic_tiny, the graph for learned_content_local_tiny.
    largest_faster_under_xla, smallest_faster_in_the_graph = (
        model_gflops(build_model(name)) for name in ("quadratic_tiny", "learned_content_local_tiny")
    )
    assert largest_faster_under_xla < SMALL_BFLOAT16_MODEL_GFLOPS < smallest_faster_in_the_graph
    assert round(model_gflops(build_model("quadratic")), 2) == 6.53  # `attnconv list`'s count, attention included


@pytest.mark.parametrize("precision", POLICY_NAMES)
def test_every_step_is_xla_on_a_cpu_without_bfloat16_units(precision):
    # Measured on AVX2: XLA faster in both training precisions; oneDNN without bfloat16 units up to 17x slower.
    assert uses_xla("cpu", precision, "tensorflow", CPU_KINDS["AVX2 only"]) is True
    assert uses_xla("cpu", precision, "tensorflow", frozenset()) is True  # a CPU whose flags are unknown


@pytest.mark.parametrize("precision", POLICY_NAMES)
@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_on_an_accelerator_the_whole_step_is_xla(platform, precision):
    assert uses_xla(platform, precision, "tensorflow") is True
    assert uses_xla(platform, precision, "jax") is True


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_jax_always_compiles_and_torch_never(platform):
    assert uses_xla(platform, "mixed_bfloat16", "jax", CPU_KINDS["AMX"]) is True  # JAX's only compiler
    assert uses_xla(platform, "mixed_bfloat16", "torch") is False  # Keras' own default there


@pytest.mark.parametrize("forced", [True, False])
def test_true_and_false_force_a_path(forced):
    assert resolve_jit_compile(forced, "mixed_bfloat16", platform="cpu", backend="tensorflow") is forced


def test_auto_is_the_rule_for_this_device():
    expected = uses_xla(default_platform(), "float32", keras.backend.backend(), cpu_capabilities()["flags"])
    assert resolve_jit_compile("auto") is expected
    assert describe_step_path(expected) == ("XLA" if expected else describe_step_path(False))


@pytest.mark.parametrize("value", ["maybe", "True", 1, None])
def test_anything_else_is_an_error_naming_the_argument_and_the_value(value):
    with pytest.raises(
        ValueError,
        match=rf"`jit_compile` must be true, false or \"auto\".*"
        rf"Received: jit_compile={value!r}",
    ):
        resolve_jit_compile(value)


def test_a_models_own_compile_default_takes_the_rule():
    model = build_model("quadratic_tiny", seed=0, num_layers=1, hidden_dim=9, intermediate_dim=9)
    model.compile()
    size = model_gflops(model)
    assert model.jit_compile is resolve_jit_compile("auto", model.dtype_policy.name, gflops_per_image=size)


@pytest.mark.parametrize(
    "flags, units, vectors",
    [
        ("fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16", "AMX", "AVX-512"),
        ("fpu avx2 avx512f avx512_bf16", "AVX-512 BF16", "AVX-512"),
        ("fpu avx2", None, "AVX2"),
    ],
)
def test_cpu_capabilities_name_the_bfloat16_and_vector_units(tmp_path, flags, units, vectors):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        f"processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\n"
        f"processor\t: 1\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: Some CPU\nflags\t\t: {flags}\n"
    )
    capabilities = cpu_capabilities(str(cpuinfo))
    assert (capabilities["model"], capabilities["bfloat16_units"], capabilities["vector_units"]) == (
        "Some CPU",
        units,
        vectors,
    )
    # The family and model numbers tell apart generations a virtual machine names alike ("AMD EPYC").
    assert (capabilities["family"], capabilities["model_number"]) == (25, 17)


def test_cpu_capabilities_of_a_machine_without_cpuinfo_are_unknown(tmp_path):
    capabilities = cpu_capabilities(str(tmp_path / "absent"))
    assert (capabilities["model"], capabilities["bfloat16_units"], capabilities["flags"]) == (
        "unknown",
        None,
        frozenset(),
    )
    assert capabilities["family"] is None and capabilities["model_number"] is None


def pretend_cpu(monkeypatch, kind):
    """Makes the rule see a CPU of `kind` (`CPU_KINDS`) instead of this machine's, wherever it asks."""
    from keras_attnconv.models import step_compilation

    flags = CPU_KINDS[kind]
    units = "AMX" if "amx_bf16" in flags else "AVX-512 BF16" if "avx512_bf16" in flags else None
    monkeypatch.setattr(
        step_compilation,
        "cpu_capabilities",
        lambda: {"model": f"a pretended {kind} CPU", "bfloat16_units": units, "flags": flags},
    )


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the CPU rule chooses between TensorFlow's paths")
@pytest.mark.parametrize("kind", sorted(CPU_KINDS))
def test_a_models_own_compile_takes_the_rule_for_the_cpu_it_runs_on(monkeypatch, kind):
    # On every kind of CPU, not only the machine's own: small models XLA everywhere, a large one the graph where
    # the CPU has bfloat16 units.
    pretend_cpu(monkeypatch, kind)
    small = build_model("quadratic_tiny", seed=0)
    small.compile()
    assert model_gflops(small) < SMALL_MODEL_GFLOPS and small.jit_compile is True
    large = build_model("resnet10", seed=0)
    large.compile()
    assert model_gflops(large) > SMALL_MODEL_GFLOPS and large.jit_compile is (kind == "AVX2 only")


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the CPU rule chooses between TensorFlow's paths")
@pytest.mark.parametrize("kind", ["AMX", "AVX-512 BF16"])
def test_a_training_run_takes_the_rule_for_the_cpu_it_runs_on(monkeypatch, kind, small_npz, tmp_path):
    from keras_attnconv.training.fit import train
    from keras_attnconv.training.recipe import load_recipe

    pretend_cpu(monkeypatch, kind)
    config = load_recipe(
        "quick",
        dataset=small_npz,
        epochs=1,
        steps_per_epoch=1,
        batch_size=20,
        verbose=0,
        export_dir=None,
        run_dir=str(tmp_path / "run"),
        precision="mixed_bfloat16",
        model_overrides={"num_layers": 1},  # the run's compiles are the test's time: one block is as small a model
    )
    metrics = train(config)  # quadratic_tiny, a small model: XLA even where bfloat16 units would take the graph
    assert (metrics["jit_compile"], metrics["step_path"]) == (True, "XLA")
