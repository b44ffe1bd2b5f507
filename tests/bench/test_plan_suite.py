# ruff: noqa: E501 (the HLO text is as XLA writes it: one instruction a line)
"""The GPU plan suite: its roofline reader of XLA programs, its GPU targets, and its guard without JAX's CUDA plugin."""

import importlib.util
import json

import numpy as np
import pytest

from keras_attnconv.bench import hlo_roofline, plan_suite

# A scheduled module as XLA writes it: a library matmul with its workspace, a fusion that slices half
# of its operand, one that slices a quarter of the sums it computes, a fused dot, cuDNN's three passes of a
# convolution, and instructions that are no kernel.
MODULE = """HloModule jit_step, is_scheduled=true

%fused_slice (param_0.1: f32[64,32]) -> f32[32,32] {
  %param_0.1 = f32[64,32]{1,0} parameter(0)
  ROOT %slice.1 = f32[32,32]{1,0} slice(%param_0.1), slice={[0:32], [0:32]}
}

%add (lhs: f32[], rhs: f32[]) -> f32[] {
  %lhs = f32[] parameter(0)
  %rhs = f32[] parameter(1)
  ROOT %total = f32[] add(%lhs, %rhs)
}

%fused_reduce_slice (param_0.3: f32[64,32]) -> bf16[4,32] {
  %param_0.3 = f32[64,32]{1,0} parameter(0)
  %bitcast.3 = f32[16,4,32]{2,1,0} bitcast(%param_0.3)
  %zero.3 = f32[] constant(0)
  %sum.3 = f32[16,32]{1,0} reduce(%bitcast.3, %zero.3), dimensions={1}, to_apply=%add
  %convert.3 = bf16[16,32]{1,0} convert(%sum.3)
  ROOT %slice.3 = bf16[4,32]{1,0} slice(%convert.3), slice={[4:8], [0:32]}
}

%fused_dot (param_0.2: bf16[16,8], param_1.2: bf16[8,4]) -> bf16[16,4] {
  %param_0.2 = bf16[16,8]{1,0} parameter(0)
  %param_1.2 = bf16[8,4]{1,0} parameter(1)
  ROOT %dot.1 = bf16[16,4]{1,0} dot(%param_0.2, %param_1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[64,32], x: bf16[16,8], w: bf16[8,4], image: bf16[2,4,4,3], k: bf16[8,3,3,3], dy: bf16[2,4,4,8]) -> f32[32,32] {
  %a = f32[64,32]{1,0} parameter(0), metadata={op_name="a"}
  %x = bf16[16,8]{1,0} parameter(1)
  %w = bf16[8,4]{1,0} parameter(2)
  %image = bf16[2,4,4,3]{3,2,1,0} parameter(3)
  %k = bf16[8,3,3,3]{3,2,1,0} parameter(4)
  %dy = bf16[2,4,4,8]{3,2,1,0} parameter(5)
  %conv = (bf16[2,4,4,8]{3,2,1,0}, u8[0]{0}) custom-call(%image, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convForward"
  %conv_filter = (bf16[8,3,3,3]{3,2,1,0}, u8[0]{0}) custom-call(%image, %dy), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBackwardFilter"
  %conv_input = (bf16[2,4,4,3]{3,2,1,0}, u8[0]{0}) custom-call(%dy, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBackwardInput"
  %gemm = (f32[64,64]{1,0}, s8[1024]{0}) custom-call(%a, %a), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["1"]}}}
  %product = f32[64,64]{1,0} get-tuple-element(%gemm), index=0
  %dot_fusion = bf16[16,4]{1,0} fusion(%x, %w), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(step)/layer/dot_general"}
  %reduce_slice_fusion = bf16[4,32]{1,0} fusion(%a), kind=kLoop, calls=%fused_reduce_slice
  ROOT %slice_fusion = f32[32,32]{1,0} fusion(%a), kind=kLoop, calls=%fused_slice
}
"""


def test_each_kernel_moves_its_operands_and_result_and_does_its_matmuls_flops():
    costs = {cost.name: cost for cost in hlo_roofline.kernel_costs(MODULE)}
    kernels = {"conv", "conv_filter", "conv_input", "gemm", "dot_fusion", "slice_fusion", "reduce_slice_fusion"}
    assert set(costs) == kernels  # no parameter
    # cuBLAS: both operands read, the product written (not its workspace); 2 * 64 * 64 * 32 FLOPs.
    assert costs["gemm"].bytes == 2 * 64 * 32 * 4 + 64 * 64 * 4
    assert costs["gemm"].flops == 2 * 64 * 64 * 32 and costs["gemm"].kind == "matmul"
    assert costs["dot_fusion"].bytes == (16 * 8 + 8 * 4 + 16 * 4) * 2
    assert costs["dot_fusion"].flops == 2 * 16 * 4 * 8
    assert costs["dot_fusion"].source == "jit(step)/layer/dot_general"
    # Each pass of a 3x3 convolution of 3 channels into 8 multiplies as many elements as the forward pass.
    for name in ("conv", "conv_filter", "conv_input"):
        assert costs[name].flops == 2 * (2 * 4 * 4 * 8) * (3 * 3 * 3) and costs[name].kind == "matmul"
    assert costs["conv"].bytes == (2 * 4 * 4 * 3 + 8 * 3 * 3 * 3 + 2 * 4 * 4 * 8) * 2
    # The slicing fusion reads the half it slices.
    assert costs["slice_fusion"].bytes == 2 * 32 * 32 * 4 and costs["slice_fusion"].kind == "kLoop"
    # A loop fusion computes only what it writes: a quarter of the sums, so a quarter of their inputs.
    assert costs["reduce_slice_fusion"].bytes == 64 * 32 * 4 // 4 + 4 * 32 * 2


def test_the_floor_of_a_kernel_is_its_slower_bound_and_the_step_s_is_their_sum():
    costs = hlo_roofline.kernel_costs(MODULE)
    gbps, tflops = 1.0, 1e-6  # 1 GB/s and 1 MFLOP/s: bytes in ns, FLOPs in us
    floors = [hlo_roofline.kernel_floor_s(cost, gbps, tflops) for cost in costs]
    assert floors == [max(cost.bytes / 1e9, cost.flops / 1e6) for cost in costs]
    totals = hlo_roofline.roofline(costs, gbps, tflops)
    assert totals["kernels"] == 7
    assert totals["floor_ms"] == pytest.approx(sum(floors) * 1e3)
    assert totals["gbytes"] == pytest.approx(sum(cost.bytes for cost in costs) / 1e9)
    assert sum(kind["kernels"] for kind in totals["by_kind"].values()) == 7
    largest = hlo_roofline.largest_kernels(costs, gbps, tflops, count=1)
    assert largest[0]["name"] == "gemm" and largest[0]["floor_us"] == pytest.approx(max(floors) * 1e6)


def test_a_compiled_jax_program_is_read_with_its_matmul_flops():
    jax = pytest.importorskip("jax")
    x, w = np.ones((128, 64), "float32"), np.ones((64, 32), "float32")
    text = jax.jit(lambda x, w: jax.numpy.tanh(x @ w)).lower(x, w).compile().as_text()
    costs = hlo_roofline.kernel_costs(text)
    assert sum(cost.flops for cost in costs) == 2 * 128 * 32 * 64
    assert sum(cost.bytes for cost in costs) >= (128 * 64 + 64 * 32 + 128 * 32) * 4


def test_text_without_an_entry_computation_is_refused():
    with pytest.raises(ValueError, match="no ENTRY computation"):
        hlo_roofline.kernel_costs("not a module")


@pytest.mark.parametrize("target", sorted(plan_suite.TARGETS))
def test_the_targets_rates_are_those_the_gpu_suite_measured_on_the_chip(target):
    chip = plan_suite.TARGETS[target]
    with open(chip.rates_from) as results:
        measured = json.load(results)
    assert chip.name in measured["device"]["device"]
    assert chip.read_gbps == pytest.approx(measured["read_gbps"], abs=0.05)
    for dtype, rate in chip.matmul_tflops.items():
        assert rate == pytest.approx(measured["matmul_tflops"][dtype], abs=0.05)
    assert f'device_description_str: "{chip.name}"' in chip.config()


@pytest.mark.skipif(
    any(importlib.util.find_spec(name) for name in ("jax_cuda12_plugin", "jax_cuda13_plugin")),
    reason="JAX's CUDA plugin is installed here",
)
def test_without_jax_s_cuda_plugin_the_plan_says_what_to_install_and_writes_nothing(tmp_path):
    with pytest.raises(RuntimeError, match=r'pip install "jax\[cuda12\]"'):
        plan_suite.run_plan(output=str(tmp_path / "plan.json"))
    assert not list(tmp_path.iterdir())


def test_the_plan_suite_refuses_an_unknown_target_naming_it(tmp_path):
    with pytest.raises(ValueError, match="target='a100'"):
        plan_suite.run_plan(output=str(tmp_path / "plan.json"), target="a100")


def _bfloat16_rows(path):
    """{(model, path): row} of a results file's mixed_bfloat16 rows."""
    with open(path) as results:
        rows = json.load(results)["rows"]
    return {(r["model"], r.get("path")): r for r in rows if r["precision"] == "mixed_bfloat16"}


def _row_of(rows, model):
    return next(row for (name, _), row in rows.items() if name == model)


@pytest.mark.parametrize(
    "before_file, after_file, header",
    [
        ("plan-h200-ffa73a2.json", "plan-h200-19591ca.json", "| before | folded content-position term |"),
        ("plan-h200-19591ca.json", "plan-h200.json", "| folded content-position term | and folded keys |"),
    ],
    ids=["content_position_fold", "key_fold"],
)
def test_the_performance_notes_plan_changes_are_those_of_the_results_files(before_file, after_file, header):
    before = _row_of(_bfloat16_rows(f"training/results/{before_file}"), "learned_content")
    after = _row_of(_bfloat16_rows(f"training/results/{after_file}"), "learned_content")
    with open("docs/performance.md") as notes:
        text = notes.read()
    assert header in text
    table = text[text.index(header) :].split("\n\n")[0]  # the table under its header, to its end

    def change(key):
        return f"{after[key]:,.2f} ({(after[key] / before[key] - 1) * 100:+.1f}%)"

    assert f"| kernels | {before['kernels']} | {after['kernels']} |" in table
    assert f"| GB moved a step | {before['gbytes']:.2f} | {change('gbytes')} |" in table
    assert f"| floor, ms | {before['floor_ms']:.2f} | {change('floor_ms')} |" in table
    step_change = f"({(after['step_mib'] / before['step_mib'] - 1) * 100:+.1f}%)"
    assert f"| step's memory, MiB | {before['step_mib']:,.0f} | {after['step_mib']:,.0f} {step_change} |" in table


def test_the_performance_notes_set_each_plan_beside_the_gpu_suite_s_fit_steps_of_its_results_files():
    plans = {chip: _bfloat16_rows(f"training/results/plan-{chip}.json") for chip in ("h200", "h100")}
    measured = {
        **_bfloat16_rows("training/results/gpu-h200-quadratic.json"),
        **_bfloat16_rows("training/results/gpu-h200-resnet18.json"),
    }
    measured_h100 = _bfloat16_rows("training/results/gpu-h100.json")

    def floor(chip, model):
        return f"{_row_of(plans[chip], model)['floor_ms']:.2f}"

    def fit_ms(table, model, path):
        row = table[(model, path)] if path else _row_of(table, model)
        return f"{100 / row['fit_images_per_second'] * 1000:.2f}"

    with open("docs/performance.md") as notes:
        text = notes.read()
    assert (
        f"| `quadratic` | {floor('h200', 'quadratic')} | {fit_ms(measured, 'quadratic', 'position')} | "
        f"{floor('h100', 'quadratic')} | {fit_ms(measured_h100, 'quadratic', 'position')} |" in text
    )
    assert f"| `learned` | {floor('h200', 'learned')} | not measured | {floor('h100', 'learned')} | " in text
    assert f"| `learned_content` | {floor('h200', 'learned_content')} (" in text
    assert (
        f"| {floor('h100', 'learned_content')} | {fit_ms(measured_h100, 'learned_content', None)} (before them) |"
        in text
    )
    assert (
        f"| `resnet18` | {floor('h200', 'resnet18')} | {fit_ms(measured, 'resnet18', None)} | "
        f"{floor('h100', 'resnet18')} | {fit_ms(measured_h100, 'resnet18', None)} |" in text
    )
