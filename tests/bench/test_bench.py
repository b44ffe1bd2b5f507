"""`attnconv bench --quick` (CPU suite) and `attnconv bench --suite gpu --quick` run and write well-formed results."""

import json
import logging
import statistics

import keras
import numpy as np
import pytest
from support import quick_bench_on_jax, tensorflow_backend_only, traced_steps

from keras_attnconv import bench, cli
from keras_attnconv.bench import clusters_suite, cpu_suite, formats, gpu_suite, plan_suite, profile_suite
from keras_attnconv.layers.path_rule import prefers_separable
from keras_attnconv.models.step_compilation import model_gflops, resolve_jit_compile
from keras_attnconv.utils import reports
from keras_attnconv.utils.reports import package_revision


def test_quick_benchmark_writes_json_and_markdown(tmp_path, capsys, monkeypatch):
    # The user's global dtype policy: the benchmark measures in its own precisions, and leaves it as it was.
    keras.config.set_dtype_policy("mixed_bfloat16")
    built = []
    build_model = cpu_suite.build_model
    monkeypatch.setattr(cpu_suite, "build_model", lambda *a, **k: built.append(build_model(*a, **k)) or built[-1])
    # The formats part is measured by `test_the_formats_suite_alone` (exports in four runtimes, most of a minute):
    # here, that the suite runs it with its settings and tabulates its rows.
    format_calls = []
    monkeypatch.setattr(
        cpu_suite, "format_benchmark", lambda **settings: format_calls.append(settings) or fake_format_rows(settings)
    )
    output = tmp_path / "bench.json"
    assert cli.main(["bench", "--quick", "--output", str(output)]) == 0
    assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert (tmp_path / "bench.png").exists() and (tmp_path / "bench.svg").exists()  # the speed-ups as a chart
    paths = ["xla", "graph"] if keras.backend.backend() == "tensorflow" else ["xla"]
    # QUICK's precision, for each of its two models on each path:
    assert [model.get_layer("pool").dtype_policy.name for model in built] == ["float32"] * 2 * len(paths)
    results = json.loads(output.read_text())
    assert results["machine"]["backend"]
    assert [(row["comparison"], row["tokens"]) for row in results["layer"]] == [
        (name, "16x16") for name in ("separable", "window7")
    ]
    modes = {"separable": ("separable", "position"), "window7": ("windowed_content", "content")}
    for row in results["layer"]:
        assert (row["fast_mode"], row["baseline_mode"]) == modes[row["comparison"]]
        assert row["fast_ms"] > 0 and row["baseline_ms"] > 0 and row["speedup"] > 0
        assert row["max_abs_difference"] <= 1e-5  # float32 layers, whatever the global policy
        # The compiled steps' memory (XLA's buffer assignment): at 16x16 tokens both fast paths need less.
        assert 0 < row["fast_step_mib"] < row["baseline_step_mib"], row
    assert [(row["model"], row["batch"], row["options"]) for row in results["model_memory"]] == [
        (case["name"], case["batch"], case["options"]) for case in bench.QUICK["memory_models"]
    ]
    assert all(
        row["peak_memory_mib"] > row["step_mib"] > 0 and row["image_size"] == 16 for row in results["model_memory"]
    )
    # Every model on every path of the backend (XLA; TensorFlow's graph), the rule's pick and the faster one marked.
    assert sorted((row["model"], row["path"]) for row in results["models"]) == sorted(
        (model, path) for model in ("quadratic_tiny", "resnet_tiny") for path in paths
    )
    for model in ("quadratic_tiny", "resnet_tiny"):
        rows = [row for row in results["models"] if row["model"] == model]
        assert sum(row["fastest"] for row in rows) == 1 and sum(row["rule"] for row in rows) == 1
        size = model_gflops(build_model(model))  # the suite's models: 32x32 images
        rule_path = "xla" if resolve_jit_compile("auto", "float32", gflops_per_image=size) else "graph"
        assert [row["path"] for row in rows if row["rule"]] == [rule_path]
    for row in results["models"]:
        assert row["images_per_second"] > 0 and row["matmul_gflops"] > 0 and 0 < row["fraction_of_matmul"]
    assert [(row["dtype"], row["path"]) for row in results["matmul"]] == [("float32", path) for path in paths]
    assert results["machine"]["cpu"]["model"]
    table = (tmp_path / "bench.md").read_text()
    assert table.count("| tokens | fast path |") == 2
    assert (
        "| model | precision | path |" in table and "| model | options | batch | step MiB | process peak MiB |" in table
    )
    assert "| model | runtime | batch 1 ms |" in table
    assert [(call["format_models"], call["bfloat16_serving"]) for call in format_calls] == [
        (formats.FORMATS_QUICK["format_models"], formats.FORMATS_QUICK["bfloat16_serving"])
    ]  # as the formats suite
    assert results["formats"] == fake_format_rows(format_calls[0]) and "| `quadratic_tiny` | litert |" in table
    assert "speed-up" in capsys.readouterr().out


def fake_format_rows(settings):
    """Made-up rows of `format_benchmark`, one per runtime for each of the settings' models."""
    from keras_attnconv.bench.formats import RUNTIMES

    return [
        {
            "model": model,
            "runtime": runtime,
            "batch1_ms": 1.0,
            "batch64_images_per_second": 64.0,
            "max_abs_difference": 0.0,
        }
        for model in settings["format_models"]
        for runtime in RUNTIMES
    ]


def assert_format_rows(rows):
    """A row per runtime for the quick model: timed, and giving Keras' probabilities (bfloat16: near them)."""
    from keras_attnconv.bench.formats import RUNTIMES

    assert [(row["model"], row["runtime"]) for row in rows] == [("quadratic_tiny", runtime) for runtime in RUNTIMES]
    for row in rows:
        assert row["batch1_ms"] > 0 and row["batch64_images_per_second"] > 0
        if row["runtime"] == "saved_model_bfloat16":  # 8 bits of mantissa: a difference, a small one
            assert 0 < row["max_abs_difference"] < 2e-2
        else:
            assert row["max_abs_difference"] <= 1e-5


def _with_bfloat16_units(monkeypatch, units):
    capabilities = reports.cpu_capabilities()
    monkeypatch.setattr(cpu_suite, "cpu_capabilities", lambda: {**capabilities, "bfloat16_units": units})


@tensorflow_backend_only("the clusters are TensorFlow's, in its graph step")
def test_the_steps_suite_groups_its_cases_as_train_sets_the_clusters_for_them(monkeypatch):
    # Train sets them for mixed_bfloat16 attention models on a CPU with bfloat16 units (element_clusters), and
    # leaves a user's own TF_XLA_FLAGS as they are: then nothing is grouped.
    models, precisions = ["quadratic_tiny", "resnet_tiny"], ["float32", "mixed_bfloat16"]
    _with_bfloat16_units(monkeypatch, "AMX")
    assert cpu_suite.clustered_step_groups(models, precisions, environ={}) == [
        ("float32", models, False),
        ("mixed_bfloat16", ["resnet_tiny"], False),
        ("mixed_bfloat16", ["quadratic_tiny"], True),
    ]
    assert cpu_suite.clustered_step_groups(models, precisions, environ={"TF_XLA_FLAGS": "--tf_xla_auto_jit=-1"}) is None
    assert cpu_suite.clustered_step_groups(models, ["float32"], environ={}) is None
    # In float32, an attention model whose content scores cover every position (`clustered_precisions`).
    assert cpu_suite.clustered_step_groups(["learned_content_tiny", "quadratic_tiny"], ["float32"], environ={}) == [
        ("float32", ["quadratic_tiny"], False),
        ("float32", ["learned_content_tiny"], True),
    ]
    _with_bfloat16_units(monkeypatch, None)
    assert cpu_suite.clustered_step_groups(models, precisions, environ={}) is None


@tensorflow_backend_only("the clusters are TensorFlow's, in its graph step")
def test_the_steps_suite_times_a_graph_step_with_the_clusters_train_sets_for_it(tmp_path, monkeypatch):
    # Posed as a CPU with AMX, the mixed_bfloat16 attention model's graph step takes the clusters, as in train: in
    # a worker whose TF_XLA_FLAGS are set (the suite raises where they did not take), beside its own matmul.
    _with_bfloat16_units(monkeypatch, "AMX")
    monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    output = tmp_path / "steps.json"
    arguments = ["--models", "quadratic_tiny", "--precisions", "mixed_bfloat16", "--output", str(output)]
    assert cli.main(["bench", "--suite", "steps", "--quick", *arguments]) == 0
    rows = {row["path"]: row for row in json.loads(output.read_text())["models"]}
    assert rows["graph"]["element_clusters"] and not rows["xla"]["element_clusters"]
    table = (tmp_path / "steps.md").read_text()
    assert "| `quadratic_tiny` | mixed_bfloat16 | graph + clusters |" in table
    assert "| `quadratic_tiny` | mixed_bfloat16 | xla |" in table and "a worker process of its own" in table


def test_the_steps_suite_alone_with_the_models_the_command_line_chooses(tmp_path, capsys):
    # The wiring, one tiny model (the quick suite checks the rows); without a ResNet its ratio column is "-".
    output = tmp_path / "steps.json"
    assert (
        cli.main(["bench", "--suite", "steps", "--quick", "--models", "quadratic_tiny", "--output", str(output)]) == 0
    )
    results = json.loads(output.read_text())
    assert {row["model"] for row in results["models"]} == {"quadratic_tiny"} and results["matmul"]
    assert results["settings"]["models"] == ["quadratic_tiny"]
    table = (tmp_path / "steps.md").read_text()
    assert table.startswith("Machine: ") and "bfloat16 units:" in table and "| `quadratic_tiny` | float32 |" in table
    assert all(line.endswith("| - |") for line in table.splitlines() if line.startswith("| `quadratic_tiny`"))
    assert "| model | precision | path |" in capsys.readouterr().out


@tensorflow_backend_only("the clusters are TensorFlow's, in its graph step")
def test_the_clusters_suite_times_each_case_with_and_without_the_flags_whatever_the_users(
    tmp_path, capsys, monkeypatch
):
    # The suite raises if a worker's flags were not the case's: a user's own TF_XLA_FLAGS is set aside for both.
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_auto_jit=-1")
    output = tmp_path / "clusters.json"
    assert cli.main(["bench", "--suite", "clusters", "--quick", "--output", str(output)]) == 0
    results = json.loads(output.read_text())
    (row,) = results["rows"]
    assert (row["model"], row["precision"]) == ("quadratic_tiny", "mixed_bfloat16")
    assert row["graph_ms"] > 0 and row["clustered_ms"] > 0
    assert row["speedup"] == pytest.approx(row["graph_ms"] / row["clustered_ms"])
    rounds = results["settings"]["rounds"]
    assert len(row["graph_ms_rounds"]) == len(row["clustered_ms_rounds"]) == rounds  # each round's, kept
    assert row["graph_ms"] == statistics.median(row["graph_ms_rounds"])
    assert row["clustered_ms"] == statistics.median(row["clustered_ms_rounds"])
    table = (tmp_path / "clusters.md").read_text()
    assert "| `quadratic_tiny` | mixed_bfloat16 |" in table and "--tf_xla_ops_to_cluster=FUSIBLE" in table
    assert "| model | precision | graph ms |" in capsys.readouterr().out


@tensorflow_backend_only("the export formats are measured there")
def test_the_formats_suite_alone(tmp_path, capsys):
    output = tmp_path / "formats.json"
    assert cli.main(["bench", "--suite", "formats", "--quick", "--output", str(output)]) == 0
    assert_format_rows(json.loads(output.read_text())["formats"])
    assert "| `quadratic_tiny` | onnx |" in (tmp_path / "formats.md").read_text()
    assert "| `quadratic_tiny` | litert |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "setting, units, measured",
    [
        ("auto", "AMX", True),
        ("auto", "AVX-512 BF16", True),
        ("auto", None, False),
        (True, None, True),
        (False, "AMX", False),
    ],
)
def test_the_bfloat16_savedmodel_is_measured_where_the_cpu_has_bfloat16_units_unless_forced(setting, units, measured):
    assert formats.measures_bfloat16_serving(setting, units) is measured


def test_a_bad_bfloat16_serving_setting_is_refused_before_anything_is_exported(monkeypatch):
    monkeypatch.setattr(formats, "unavailable", lambda: pytest.fail("the runtimes were looked up"))
    with pytest.raises(
        ValueError,
        match=r"`bfloat16_serving` must be true, false or \"auto\"\. "
        r"Received: bfloat16_serving='yes'",
    ):
        formats.format_benchmark(("quadratic_tiny",), repeats=1, bfloat16_serving="yes")


@pytest.mark.parametrize(
    "given, expected",
    [([], "auto"), (["--bfloat16-serving", "yes"], True), (["--bfloat16-serving", "no"], False), (["--quick"], True)],
)
def test_the_formats_suite_measures_the_bfloat16_savedmodel_as_the_command_line_says(
    tmp_path, capsys, monkeypatch, given, expected
):
    settings = []
    monkeypatch.setattr(formats, "format_benchmark", lambda **kwargs: settings.append(kwargs) or {"skipped": "a test"})
    assert cli.main(["bench", "--suite", "formats", *given, "--output", str(tmp_path / "o.json")]) == 0
    assert [call["bfloat16_serving"] for call in settings] == [expected]


def test_a_bad_bfloat16_serving_word_is_refused_by_the_command_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["bench", "--suite", "formats", "--bfloat16-serving", "maybe", "--output", str(tmp_path / "o.json")])
    assert exit.value.code == 2
    assert "--bfloat16-serving: invalid choice: 'maybe' (choose from" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_cpu_without_bfloat16_units_gets_no_bfloat16_savedmodel_and_its_row_says_why(monkeypatch):
    # The full suite's setting on an AVX2 CPU: the slow export is neither written nor run, and the table keeps
    # its row with the reason. Fake exports and runtimes (the quick formats suite runs the real ones).
    monkeypatch.setattr(formats, "cpu_capabilities", lambda: {"bfloat16_units": None})
    monkeypatch.setattr(formats, "unavailable", lambda: None)
    exported = []
    monkeypatch.setattr(
        "keras_attnconv.export.exporter.export_model", lambda model, path, **options: exported.append(options) or path
    )
    probabilities = lambda model, path: lambda x: np.full((len(x), 10), 0.1)  # noqa: E731
    monkeypatch.setattr(formats, "_LOADERS", dict.fromkeys(formats.RUNTIMES, probabilities))
    rows = formats.format_benchmark(**{**formats.FORMATS_FULL, "format_models": ("quadratic_tiny",), "repeats": 1})
    assert [row["runtime"] for row in rows] == list(formats.RUNTIMES)
    assert all(options.get("compute_dtype") != "bfloat16" for options in exported) and len(exported) == 3
    (left_out,) = [row for row in rows if "skipped" in row]
    assert left_out["runtime"] == "saved_model_bfloat16" and "no bfloat16 units" in left_out["skipped"]
    table = formats.formats_markdown(rows, repeats=1)
    assert "| `quadratic_tiny` | saved_model_bfloat16 | not measured: this CPU has no bfloat16 units" in table
    assert "| `quadratic_tiny` | onnx | " in table


def test_program_memory_is_the_largest_buffer_assignment(tmp_path):
    """The sum of a dumped program's allocations (TensorFlow's XLA prints it too; JAX's does not), largest program."""
    from keras_attnconv.bench.measure import largest_program_mib

    assert largest_program_mib(str(tmp_path)) is None  # nothing compiled with XLA
    step = (
        "allocation 0: size 3145728, parameter 0, shape |f32[786432]| at ShapeIndex {}:\n"
        " value: <1 x @0> (size=3145728,offset=0): f32[786432]{0}\n"
        "allocation 1: size 1048576, preallocated-temp:\n"
        " value: <2 y @0> (size=1048576,offset=0): f32[262144]{0}\n"
    )
    (tmp_path / "module_0002.jit_train_step.cpu_after_optimizations-buffer-assignment.txt").write_text(step)
    (tmp_path / "module_0001.jit_small.cpu_after_optimizations-buffer-assignment.txt").write_text(
        "allocation 0: size 1048576, parameter 0:\nTotal bytes used: 1048576 (1.00MiB)\n"
    )
    assert largest_program_mib(str(tmp_path)) == 4.0


def test_gpu_suite_covers_every_model_precision_and_both_quadratic_paths():
    found = [gpu_suite._case_key(case) for case in gpu_suite.cases(bench.GPU_FULL)]
    precisions = ("float32", "mixed_bfloat16", "mixed_float16")
    expected = {
        (model, precision, None, True)
        for model in ("gaussian", "learned", "learned_content", "resnet18")
        for precision in precisions
    }
    expected |= {("quadratic", precision, path, True) for path in ("separable", "position") for precision in precisions}
    # ResNet-18 once more in mixed_float16, without Keras' loss scaling: what the scaling costs, side by side.
    expected.add(("resnet18", "mixed_float16", None, False))
    assert sorted(found) == sorted(expected)
    assert bench.GPU_FULL["batch"] == 100 and bench.GPU_FULL["steps"] >= 20 and bench.GPU_FULL["fit_images"] >= 5000


def test_the_floor_is_the_longer_of_the_larger_flop_count_at_the_matmul_rate_and_the_bytes_at_the_bandwidth():
    rates, bandwidth = {"bfloat16": 500.0, "float32": 100.0}, 1000.0  # TFLOP/s, GB/s
    row = {"precision": "mixed_bfloat16", "flops_per_step": 2e12, "xla_flops": 1e11, "xla_bytes": 1e9}
    assert gpu_suite.floor_ms(row, rates, bandwidth) == pytest.approx(4.0)  # the formula's FLOPs: 2e12 / 5e14
    assert gpu_suite.floor_ms({**row, "xla_flops": 4e12}, rates, bandwidth) == pytest.approx(8.0)  # XLA's, larger
    assert gpu_suite.floor_ms({**row, "xla_bytes": 1e10}, rates, bandwidth) == pytest.approx(10.0)  # memory-bound
    assert gpu_suite.floor_ms({**row, "precision": "float32"}, rates, bandwidth) == pytest.approx(20.0)
    assert gpu_suite.floor_ms({**row, "xla_flops": None}, rates, bandwidth) is None


def test_gpu_suite_measures_the_recipes_precision_first():
    assert gpu_suite.cases(bench.GPU_FULL)[0]["precision"] == "mixed_bfloat16"


def test_quick_gpu_suite_runs_on_jax_without_tensorflow(tmp_path, jax_without_tensorflow):
    output = tmp_path / "gpu.json"
    results, result = quick_bench_on_jax("gpu", output, jax_without_tensorflow)
    assert results["command"] == f"attnconv bench --suite gpu --quick --output {output}"
    assert set(results["matmul_tflops"]) == {"float32", "bfloat16", "float16"}
    rows = {(row["model"], row["path"], row["loss_scaling"]): row for row in results["rows"]}
    assert set(rows) == {
        ("quadratic_tiny", "separable", True),
        ("quadratic_tiny", "position", True),
        ("resnet_tiny", None, True),
        ("resnet_tiny", None, False),
    }
    # The step ran with a LossScaleOptimizer exactly where loss scaling was asked for (all rows are mixed_float16).
    assert all(row["loss_scale_optimizer"] == row["loss_scaling"] for row in results["rows"])
    grid = bench.GPU_QUICK["image_size"] // 2  # the tiny model's 2x2 down-sampling
    auto = "separable" if prefers_separable(grid, grid, "cpu") else "position"
    assert {row["auto_path"] for row in results["rows"] if row["model"] == "quadratic_tiny"} == {auto}
    for row in results["rows"]:
        assert row["precision"] == "mixed_float16" and row["finite_loss"]
        assert row["step_ms"] > 0 and row["fit_images_per_second"] > 0 and row["compile_seconds"] > 0
        assert row["peak_memory_mib"] > 0 and row["achieved_tflops"] > 0 and row["fraction_of_matmul"] > 0
        assert row["program_mib"] > 0  # the compiled step's own memory, from XLA's buffer assignment
        # XLA's count of the work, and the floor it sets, for the model measured on each path only.
        costed = row["model"] == "quadratic_tiny"
        floor = gpu_suite.floor_ms(row, results["matmul_tflops"], results["read_gbps"])
        assert (
            (row["xla_flops"] > 0 and row["xla_bytes"] > 0 and floor > 0)
            if costed
            else (row["xla_flops"] is None and floor is None)
        )
    assert results["read_gbps"] > 0
    table = (tmp_path / "gpu.md").read_text()
    assert "| model | path | precision |" in table and f"{auto} (auto)" in table and "| floor ms |" in table
    assert "| step MiB |" in table and "| mixed_float16, no loss scaling |" in table
    assert f"Device: cpu (cpu): {reports.machine_text(results['device'])};" in table  # which CPU, beside its figures
    assert "fit images/s" in result.stdout
    # No GPU here: said when the run starts, and in the table, which judges none of the GPU targets.
    assert "The gpu suite on cpu (cpu): not a GPU the targets are set for (H200 and H100)" in result.stderr
    assert "none judged: the device, cpu (cpu), is not a GPU they are set for." in table


# A GPU suite's worker results, made up: the suite's bookkeeping without a device.
FAKE_GPU_REFERENCES = {
    "device": {"device": "fake", "backend": "jax"},
    "matmul_tflops": dict.fromkeys(("float32", "bfloat16", "float16"), 1.0),
    "read_gbps": 1.0,
}


def fake_gpu_row(case):
    return {
        **{k: case[k] for k in ("model", "precision", "forced_path", "loss_scaling")},
        "path": case["forced_path"],
        "auto_path": None,
        "compile_seconds": 1.0,
        "step_ms": 2.0,
        "fit_images_per_second": 3.0,
        "peak_memory_mib": 4.0,
        "memory_source": "fake",
        "achieved_tflops": 0.5,
        "flops_per_step": 1e9,
    }


def workers_cut_off_after_two_cases(measured):
    """Fake GPU workers that measure the references, then two cases, then hit a time limit once; `measured` logs it."""

    def fake_workers(kind, cases, concurrently, **_):
        if kind == "gpu-references":
            measured.append("references")
            return [FAKE_GPU_REFERENCES]
        (case,) = cases
        if len(measured) == 3 and "crash" not in measured:
            measured.append("crash")
            raise RuntimeError("time limit")
        measured.append(gpu_suite._case_key(case))
        return [fake_gpu_row(case)]

    return fake_workers


def test_gpu_suite_goes_on_from_the_cases_already_measured(tmp_path, monkeypatch):
    # A run cut off by a time limit keeps its finished cases; the same command finishes the table.
    measured = []
    monkeypatch.setattr(gpu_suite, "run_in_workers", workers_cut_off_after_two_cases(measured))
    output = tmp_path / "gpu.json"
    all_cases = [gpu_suite._case_key(case) for case in gpu_suite.cases(bench.GPU_FULL)]
    try:
        bench.run_gpu_benchmark(output=str(output))
    except RuntimeError:
        pass
    assert [gpu_suite._case_key(row) for row in json.loads(output.read_text())["rows"]] == all_cases[:2]
    results = bench.run_gpu_benchmark(output=str(output))
    assert measured.count("references") == 1 and len(measured) == 1 + 1 + len(all_cases)  # no case twice
    assert [gpu_suite._case_key(row) for row in results["rows"]] == all_cases
    assert all(row["fraction_of_matmul"] == 0.5 for row in results["rows"])
    # Other settings start over instead of mixing two runs in one table.
    bench.run_gpu_benchmark(output=str(output), batch=50)
    assert measured.count("references") == 2
    assert json.loads(output.read_text())["settings"]["batch"] == 50
    # So does other code: rows measured before a layer changed are not the current code's figures.
    monkeypatch.setattr(gpu_suite, "code_digest", lambda: "changed")
    bench.run_gpu_benchmark(output=str(output), batch=50)
    assert measured.count("references") == 3 and json.loads(output.read_text())["code"] == "changed"


def test_gpu_suite_goes_on_from_a_file_written_before_files_recorded_the_package_revision(tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr(gpu_suite, "run_in_workers", workers_cut_off_after_two_cases(measured))
    output = tmp_path / "gpu.json"
    with pytest.raises(RuntimeError, match="time limit"):
        bench.run_gpu_benchmark(output=str(output))
    earlier = json.loads(output.read_text())
    assert earlier["package"] == package_revision() and earlier["device"]["keras"] == keras.__version__
    # As the committed results files are: no "package", and the device record as the references worker wrote it.
    del earlier["package"]
    earlier["device"] = FAKE_GPU_REFERENCES["device"]
    output.write_text(json.dumps(earlier))
    results = bench.run_gpu_benchmark(output=str(output))
    assert measured.count("references") == 1  # gone on from the file, not started over
    assert [gpu_suite._case_key(row) for row in results["rows"]] == [
        gpu_suite._case_key(case) for case in gpu_suite.cases(bench.GPU_FULL)
    ]
    assert json.loads(output.read_text()) == results and results["package"] == package_revision()


def test_gpu_suite_models_and_image_size_come_from_the_command_line(tmp_path, monkeypatch):
    chosen = []

    def fake_workers(kind, cases, concurrently, **_):
        if kind == "gpu-references":
            return [FAKE_GPU_REFERENCES]
        (case,) = cases
        chosen.append((case["model"], case["image_size"]))
        return [fake_gpu_row(case)]

    monkeypatch.setattr(gpu_suite, "run_in_workers", fake_workers)
    output = tmp_path / "gpu64.json"
    assert (
        cli.main(
            [
                "bench",
                "--suite",
                "gpu",
                "--models",
                "learned_content,learned_content_local",
                "--image-size",
                "64",
                "--output",
                str(output),
            ]
        )
        == 0
    )
    assert chosen == [
        (model, 64) for _ in bench.GPU_FULL["precisions"] for model in ("learned_content", "learned_content_local")
    ]
    settings = json.loads(output.read_text())["settings"]
    assert settings["models"] == ["learned_content", "learned_content_local"] and settings["image_size"] == 64


def test_gpu_suite_precisions_come_from_the_command_line(tmp_path, monkeypatch):
    # A run cut short by a device's time limit measures the cases it left into a file of its own.
    measured = []
    monkeypatch.setattr(
        gpu_suite,
        "run_in_workers",
        lambda kind, cases, concurrently, **_: (
            [FAKE_GPU_REFERENCES]
            if kind == "gpu-references"
            else [measured.append(cases[0]["precision"]) or fake_gpu_row(cases[0])]
        ),
    )
    output = tmp_path / "gpu-rest.json"
    assert (
        cli.main(
            [
                "bench",
                "--suite",
                "gpu",
                "--models",
                "resnet18",
                "--precisions",
                "mixed_float16,float32",
                "--output",
                str(output),
            ]
        )
        == 0
    )
    assert measured == ["mixed_float16", "mixed_float16", "float32"]  # ResNet-18 with and without loss scaling
    assert json.loads(output.read_text())["settings"]["precisions"] == ["mixed_float16", "float32"]


def test_the_steps_suite_drops_tensorflows_retracing_warning_while_it_builds_its_models(monkeypatch, caplog):
    # A model per path and precision traces its own step, as meant; with more than the quick suite's two
    # models TensorFlow warns of "retracing". The suite's builds, faked here, log that warning and stop it.
    retracing = "6 out of the last 6 calls to <function one_step_on_data> triggered tf.function retracing."

    class Built(Exception):
        pass

    def build_and_warn(*args, **kwargs):
        logging.getLogger("tensorflow").warning(retracing)
        raise Built

    monkeypatch.setattr(cpu_suite, "matmul_step", lambda *args: None)
    monkeypatch.setattr(cpu_suite, "_model_step", build_and_warn)
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        with pytest.raises(Built):
            cpu_suite.model_step_benchmark(["quadratic_tiny"], ["float32"], model_batch=2, repeats=1, matmul=8)
        assert caplog.records == []
        with pytest.raises(Built):
            build_and_warn()  # the same warning outside the suite is shown
    assert [record.getMessage() for record in caplog.records] == [retracing]


def test_the_steps_suite_measures_the_precisions_the_command_line_chooses(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_suite, "clustered_step_groups", lambda *args: None)  # in this process, whatever the CPU
    chosen = []
    monkeypatch.setattr(
        cpu_suite, "model_step_benchmark", lambda **settings: chosen.append(settings["precisions"]) or ([], [])
    )
    assert (
        cli.main(
            [
                "bench",
                "--suite",
                "steps",
                "--quick",
                "--precisions",
                "mixed_bfloat16",
                "--output",
                str(tmp_path / "steps.json"),
            ]
        )
        == 0
    )
    assert chosen == [("mixed_bfloat16",)]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            ["--suite", "cpu", "--precisions", "float32"],
            "--precisions is for the gpu, steps, clusters, profile and plan suites; the cpu suite has its own cases. "
            "Received: --suite cpu",
        ),
        (
            ["--suite", "gpu", "--precisions", "mixed_bfloat61"],
            "Did you mean 'mixed_bfloat16' or 'mixed_float16' or 'bfloat16'? Received: precisions='mixed_bfloat61'",
        ),
        (
            ["--suite", "steps", "--precisions", "bfloat16"],
            "`precisions` must keep float32 weights to train: one of 'float32', 'mixed_bfloat16', 'mixed_float16'",
        ),
        (
            ["--suite", "gpu", "--precisions", "float32,float32"],
            "`precisions` must name each training precision to measure once: some of 'float32', 'mixed_bfloat16', "
            "'mixed_float16'. Received: precisions='float32,float32'",
        ),
        (
            ["--suite", "cpu", "--models", "quadratic"],
            "--models is for the gpu, steps, clusters, formats, profile and plan suites; the cpu suite has its own "
            "cases. Received: --suite cpu",
        ),
        (
            ["--suite", "profile", "--models", "quadratic", "--image-size", "64"],
            "--image-size is for the gpu suite; the profile suite has its own cases",
        ),
        (
            ["--suite", "scale", "--models", "quadratic", "--precisions", "float32"],
            "--models is for the gpu, steps, clusters, formats, profile and plan suites, --precisions is for the gpu, "
            "steps, clusters, profile and plan suites; the scale suite",
        ),
        (["--suite", "profile", "--models", "quadratc"], "Unknown model 'quadratc'. Did you mean 'quadratic'"),
        (
            ["--suite", "profile", "--models", "quadratic,learned"],
            "`models` must name one model: the profile suite profiles one model's step a run. "
            "Received: models='quadratic,learned'",
        ),
        (
            ["--suite", "profile", "--precisions", "mixed_bfloat61"],
            "Did you mean 'mixed_bfloat16' or 'mixed_float16' or 'bfloat16'? Received: precisions='mixed_bfloat61'",
        ),
        (["--suite", "steps", "--image-size", "64"], "--image-size is for the gpu suite; the steps suite has its own"),
        (
            ["--suite", "steps", "--bfloat16-serving", "yes"],
            "--bfloat16-serving is for the formats suite; the steps suite has its own cases",
        ),
        (["--suite", "steps", "--models", "quadratc"], "Unknown model 'quadratc'. Did you mean 'quadratic'"),
        (["--suite", "gpu", "--models", "quadratc"], "Unknown model 'quadratc'. Did you mean 'quadratic'"),
        (["--suite", "formats", "--models", "quadratc"], "Unknown model 'quadratc'. Did you mean 'quadratic'"),
        (["--suite", "plan", "--models", "quadratc"], "Unknown model 'quadratc'. Did you mean 'quadratic'"),
        (["--suite", "clusters", "--models", "quadratc"], "Unknown model 'quadratc'. Did you mean 'quadratic'"),
        (["--suite", "clusters", "--image-size", "64"], "--image-size is for the gpu suite; the clusters suite has"),
        (["--suite", "steps", "--models", "quadratic_tiny,quadratc"], "Received: models='quadratc'"),  # not name=
        (
            ["--suite", "plan", "--precisions", "mixed_bfloat61"],
            "Did you mean 'mixed_bfloat16' or 'mixed_float16' or 'bfloat16'? Received: precisions='mixed_bfloat61'",
        ),
        (["--suite", "gpu", "--target", "h100"], "--target is for the plan suite; the gpu suite has its own cases"),
        (["--suite", "gpu", "--image-size", "0"], "`image_size` must be a positive integer. Received: image_size=0"),
        (["--suite", "gpu", "--models", "quadratic", "--image-size", "33"], "`image_size` must be a multiple of"),
    ],
)
def test_bench_flags_are_checked_before_any_measurement(tmp_path, capsys, monkeypatch, arguments, message):
    monkeypatch.setattr(gpu_suite, "run_in_workers", lambda *args, **kwargs: pytest.fail("a worker started"))
    monkeypatch.setattr(cpu_suite, "model_step_benchmark", lambda **kwargs: pytest.fail("a step was measured"))
    monkeypatch.setattr(cpu_suite, "run_in_workers", lambda *args, **kwargs: pytest.fail("a worker started"))
    monkeypatch.setattr(formats, "format_benchmark", lambda **kwargs: pytest.fail("a format was measured"))
    monkeypatch.setattr(profile_suite, "run_in_workers", lambda *args, **kwargs: pytest.fail("a worker started"))
    monkeypatch.setattr(plan_suite, "run_in_workers", lambda *args, **kwargs: pytest.fail("a worker started"))
    monkeypatch.setattr(clusters_suite, "run_in_workers", lambda *args, **kwargs: pytest.fail("a worker started"))
    assert cli.main(["bench", *arguments, "--output", str(tmp_path / "out.json")]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_formats_suite_refuses_a_model_that_does_not_take_the_sample_images(tmp_path, capsys, monkeypatch):
    # Every registered model takes 32x32 images, as the embedded sample has: pretend the sample is 16x16.
    monkeypatch.setattr(formats, "real_images", lambda count: np.zeros((count, 16, 16, 3), np.uint8))
    monkeypatch.setattr(formats, "format_benchmark", lambda **kwargs: pytest.fail("a format was measured"))
    assert cli.main(["bench", "--suite", "formats", "--models", "quadratic", "--output", str(tmp_path / "o.json")]) == 2
    assert "runs the embedded 16x16 CIFAR-10 images; 'quadratic' takes 32x32. Received: models=('quadratic',)" in (
        capsys.readouterr().err
    )
    assert list(tmp_path.iterdir()) == []


def _step_row(precision, fraction, step_ms, path="xla", rule=True, model="quadratic"):
    return {
        "model": model,
        "precision": precision,
        "path": path,
        "rule": rule,
        "fraction_of_matmul": fraction,
        "step_ms": step_ms,
    }


@pytest.mark.parametrize(
    "units, bfloat16_row, expected",
    [
        # Without bfloat16 units: the float32 target only, and a line saying why there is no bfloat16 one.
        (
            None,
            _step_row("mixed_bfloat16", 0.2, 3000.0),
            [
                "- `quadratic` float32 (xla) at >= 75% of the best float32 matmul rate: 68%, missed by 7 points",
                "- `quadratic` mixed_bfloat16: no target on a CPU without bfloat16 units (AMX, AVX-512 BF16)",
            ],
        ),
        # AMX: half the bfloat16 matmul rate, on the rule's path (the graph), not the other one.
        (
            "AMX",
            _step_row("mixed_bfloat16", 0.55, 1350.0, path="graph"),
            [
                "- `quadratic` float32 (xla) at >= 75% of the best float32 matmul rate: 68%, missed by 7 points",
                "- `quadratic` mixed_bfloat16 (graph) at >= 50% of the best bfloat16 matmul rate: 55%, met",
            ],
        ),
        # AVX-512 BF16 without AMX: twice the float32 step's speed (3,150 / 2,100 = 1.5x).
        (
            "AVX-512 BF16",
            _step_row("mixed_bfloat16", 0.3, 2100.0, path="graph"),
            [
                "- `quadratic` float32 (xla) at >= 75% of the best float32 matmul rate: 68%, missed by 7 points",
                "- `quadratic` mixed_bfloat16 (graph) at >= 2x the float32 step's speed (AVX-512 BF16): 1.50x, "
                "missed by 1.33x",
            ],
        ),
    ],
)
def test_the_steps_table_says_which_cpu_targets_are_met_and_by_how_much_others_are_missed(
    units, bfloat16_row, expected
):
    from keras_attnconv.bench.step_targets import targets_markdown

    rows = [
        _step_row("float32", 0.68, 3150.0),
        _step_row("float32", 0.9, 100.0, path="graph", rule=False),
        _step_row("mixed_bfloat16", 0.99, 10.0, path="xla" if bfloat16_row["path"] == "graph" else "graph", rule=False),
        _step_row("float32", 0.99, 10.0, model="resnet18"),
        bfloat16_row,
    ]
    assert targets_markdown(rows, units).splitlines() == ["Targets (keras_attnconv/bench/step_targets.py):", *expected]


def test_a_target_names_the_clusters_its_graph_step_ran_with():
    from keras_attnconv.bench.step_targets import targets_markdown

    clustered = {**_step_row("mixed_bfloat16", 0.39, 712.0, path="graph"), "element_clusters": True}
    assert targets_markdown([clustered], "AMX").splitlines()[1] == (
        "- `quadratic` mixed_bfloat16 (graph + clusters) at >= 50% of the best bfloat16 matmul rate: 39%, "
        "missed by 11 points"
    )


def test_a_run_without_the_quadratic_model_lists_no_targets():
    from keras_attnconv.bench.step_targets import targets_markdown

    assert targets_markdown([_step_row("float32", 0.5, 10.0, model="quadratic_tiny")], None) == ""


@pytest.mark.parametrize("given", ["res.md", "res.json", "res.MD", "res"])
def test_an_output_named_for_either_format_writes_both_files(tmp_path, capsys, monkeypatch, given):
    monkeypatch.setattr(formats, "format_benchmark", lambda **settings: {"skipped": "a test"})
    assert cli.main(["bench", "--suite", "formats", "--quick", "--output", str(tmp_path / given)]) == 0
    json_path, markdown_path = (tmp_path / ("res" if given == "res" else "res.json"), tmp_path / "res.md")
    assert f"wrote {json_path} and {markdown_path}" in capsys.readouterr().out
    assert json.loads(json_path.read_text())["formats"] == {"skipped": "a test"}
    assert markdown_path.read_text() == "Inference in each export format: not measured (a test).\n"


def test_scale_suite_measures_each_device_count_with_the_same_global_batch(
    tmp_path, monkeypatch, jax_without_tensorflow
):
    # The workers run on JAX without TensorFlow (faster to start, and the GPU machine's setting); a count of
    # devices the batch does not split over is skipped, and said so, without a worker's compile.
    monkeypatch.setenv("PYTHONPATH", jax_without_tensorflow["PYTHONPATH"])
    output = tmp_path / "scale.json"
    results = bench.run_scale_benchmark(
        quick=True, output=str(output), devices=(2, 3), batch=8, image_size=8, fit_images=16, timed_epochs=1
    )
    assert json.loads(output.read_text())["settings"]["devices"] == [2, 3]
    assert results["device"]["backend"] == "jax" and results["device"]["cpu_model"]
    rows = {row["devices"]: row for row in results["rows"]}
    assert list(rows) == [None, 2, 3]
    assert rows[3]["skipped"] == "a batch of 8 does not split over 3 devices"
    for count in (None, 2):
        assert rows[count]["images_per_second"] > 0 and rows[count]["device_kind"] == "cpu"
        assert rows[count]["available"] == 3  # the CPU posed as the largest count
    assert rows[2]["per_device_batch"] == 4 and rows[None]["per_device_batch"] == 8
    table = (tmp_path / "scale.md").read_text()
    assert "| 1, no distribution | 8 |" in table and "| 3 | - | skipped" in table
    assert "not a speed-up of separate devices" in table


def test_a_gpu_case_fits_with_the_step_it_compiled_for_the_timed_steps(monkeypatch):
    """A full model's compilation costs tens of seconds of a lent GPU: `fit` must not compile the step again."""
    traces, traces_before_fit = [], []
    build = gpu_suite.build_case_model

    def counting_build(*args, **kwargs):
        built, auto_path = build(*args, **kwargs)
        traces.append(traced_steps(built))
        fit = built.fit
        built.fit = lambda *fit_args, **fit_kwargs: (
            traces_before_fit.append(traces[0]["train"]) or fit(*fit_args, **fit_kwargs)
        )
        return built, auto_path

    monkeypatch.setattr(gpu_suite, "build_case_model", counting_build)
    settings = {**bench.GPU_QUICK, "precisions": ("float32",)}
    case = next(case for case in gpu_suite.cases(settings) if case["model"] == "resnet_tiny")
    row = gpu_suite.measure_case(**case)
    assert row["finite_loss"] and row["fit_images_per_second"] > 0
    (counted,) = traces
    assert traces_before_fit == [counted["train"]] and counted["train"], (traces_before_fit, counted)
