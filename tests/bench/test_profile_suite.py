"""`attnconv bench --suite profile`: a step's time by op kind, from the backend's profiler's trace."""

import json
import os
from types import SimpleNamespace

import pytest
from support import quick_bench_on_jax, tensorflow_backend_only

from keras_attnconv import bench, cli
from keras_attnconv.bench import profile_suite
from keras_attnconv.bench.profile_suite import FRAMEWORK, category, counted_lines, op_kind, self_times_by_kind
from keras_attnconv.utils import reports

MS = 10**9  # picoseconds


def test_an_ops_kind_is_its_type_or_its_xla_name_without_numbers():
    assert op_kind("model/encoder_0/attention/Tensordot/MatMul_1:MatMul") == "MatMul"
    assert op_kind("cluster: MatMul_1.180") == "MatMul"
    assert op_kind("loop_multiply_fusion.12") == "loop_multiply_fusion"
    assert category("MatMul") == category("BatchMatMulV2") == category("convolution") == "matmul"
    assert category("StatelessRandomUniformV2") == category("rng-bit-generator") == "random"
    assert category("loop_multiply_fusion") == "other"
    assert category("loop_convert_fusion") == category("convert_bitcast_fusion") == "other"  # casts, not convolutions
    # A GPU's matmuls are named by their library's kernels.
    assert (
        category("nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT") == category("sm90_xmma_gemm_f32f32_tf32f32") == ("matmul")
    )


def test_self_time_goes_to_the_op_a_framework_event_runs_inside_else_to_framework_and_waiting():
    main_thread = [
        ("EagerExecute", 0, 10 * MS),  # waits 10 ms for the step, 3 ms of it its own
        ("a/MatMul:MatMul", 1 * MS, 4 * MS),
        ("ParallelFor", 2 * MS, 2 * MS),  # the thread pool running the MatMul: the MatMul's time
        ("b/Mul:Mul", 6 * MS, 3 * MS),
    ]
    pool_thread = [("ThunkExecutor::Execute", 0, 5 * MS), ("MatMul.3", 0, 4 * MS)]
    seconds = self_times_by_kind([main_thread, pool_thread])
    assert seconds["MatMul"] == pytest.approx(8e-3)  # 4 ms (its ParallelFor included) + 4 ms on the pool
    assert seconds["Mul"] == pytest.approx(3e-3)
    assert seconds[FRAMEWORK] == pytest.approx(3e-3 + 1e-3)
    assert sum(seconds.values()) == pytest.approx(15e-3)  # every picosecond once


@tensorflow_backend_only("its graph path is profiled beside XLA")
def test_quick_profile_splits_each_paths_step_by_op_kind(tmp_path, capsys, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the workers' temporary files
    output = tmp_path / "profile.json"
    # Posed as a CPU with AMX, where train runs a mixed_bfloat16 attention model's graph step with the
    # element-wise clusters: so does the profile (the suite raises where a worker's flags did not take).
    capabilities = reports.cpu_capabilities()
    monkeypatch.setattr(profile_suite, "cpu_capabilities", lambda: {**capabilities, "bfloat16_units": "AMX"})
    monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    # The model and the precisions the command line names (the default model is profiled on JAX below).
    arguments = ["--models", "learned_content_tiny", "--precisions", "mixed_bfloat16"]
    assert cli.main(["bench", "--suite", "profile", "--quick", *arguments, "--output", str(output)]) == 0
    assert not list(scratch.glob("attnconv-profile-*"))  # the traces are read, not left behind
    results = json.loads(output.read_text())
    assert results["settings"]["model"] == "learned_content_tiny"
    assert [(row["model"], row["precision"], row["path"]) for row in results["rows"]] == [
        ("learned_content_tiny", "mixed_bfloat16", path) for path in ("xla", "graph")
    ]
    assert [row["element_clusters"] for row in results["rows"]] == [False, True]
    for row in results["rows"]:
        total, share = profile_suite.shares(row)
        assert row["step_ms"] > 0 and total > 0 and share["matmul"] > 0
        assert sum(share.values()) == pytest.approx(1.0)
        assert 0 < row["cores_busy"] <= os.cpu_count() + 0.5  # the OS's count, a little slack for its ticks
    table = (tmp_path / "profile.md").read_text()
    assert "`learned_content_tiny`, batch 2, 8x8x3" in table
    assert "| precision | path | step ms | op ms | matmul | random | other |" in table
    assert "| CPU cores busy (OS) |" in table
    assert "| mixed_bfloat16 | xla |" in table and "| mixed_bfloat16 | graph + clusters |" in table
    assert "the 5 largest op kinds" in capsys.readouterr().out


def test_on_a_gpu_only_its_streams_are_counted_else_every_host_thread():
    def line(name):
        return SimpleNamespace(name=name, events=[])

    kernels, copies, launches = line("Stream #14(Compute)"), line("Stream #15(MemcpyH2D)"), line("python3")
    gpu_planes = [("/host:CPU", [launches]), ("/device:GPU:0", [kernels, line("XLA Modules"), copies])]
    assert counted_lines(gpu_planes) == ([kernels, copies], True)  # the host's launch events would count twice
    host_planes = [("/host:CPU", [launches, line("tf_XLAEigen/1")]), ("/host:metadata", [])]
    lines, device_kernels = counted_lines(host_planes)
    assert [counted.name for counted in lines] == ["python3", "tf_XLAEigen/1"] and not device_kernels


def test_every_event_of_a_device_stream_is_a_kernel_even_a_cpp_one():
    cutlass = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>(Params)"
    stream = [("loop_add_fusion_3", 0, 2 * MS), (cutlass, 2 * MS, 5 * MS), ("MemcpyD2H", 7 * MS, 1 * MS)]
    seconds = self_times_by_kind([stream], device_kernels=True)
    assert seconds == pytest.approx({"loop_add_fusion": 2e-3, cutlass: 5e-3, "MemcpyD2H": 1e-3})
    assert category(cutlass) == "matmul"
    # On a host's thread the same "::" marks a framework's event, whose time is the framework's.
    assert FRAMEWORK in self_times_by_kind([stream])


def test_quick_profile_runs_on_jax_without_tensorflow(tmp_path, jax_without_tensorflow):
    output = tmp_path / "profile.json"
    results, _ = quick_bench_on_jax("profile", output, jax_without_tensorflow)
    assert results["settings"]["paths"] == ["xla"]  # JAX has no graph path
    (row,) = results["rows"]
    assert row["model"] == bench.PROFILE_QUICK["model"]  # the suite's own, where --models names none
    total, share = profile_suite.shares(row)
    assert row["path"] == "xla" and row["step_ms"] > 0 and total > 0 and share["matmul"] > 0
    assert row["trace_lines"]  # the lines the op time was read from
    assert "Keras" in (tmp_path / "profile.md").read_text().splitlines()[0]
