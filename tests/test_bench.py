"""`attnconv bench --quick` runs and writes a well-formed JSON and table."""

import json

import keras

from keras_attnconv import bench, cli


def test_quick_benchmark_writes_json_and_markdown(tmp_path, capsys, monkeypatch):
    # The user's global dtype policy: the benchmark measures in its own precisions, and leaves it as it was.
    keras.config.set_dtype_policy("mixed_bfloat16")
    built = []
    build_model = bench.build_model
    monkeypatch.setattr(bench, "build_model", lambda *a, **k: built.append(build_model(*a, **k)) or built[-1])
    output = tmp_path / "bench.json"
    assert cli.main(["bench", "--quick", "--output", str(output)]) == 0
    assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert [model.get_layer("pool").dtype_policy.name for model in built] == ["float32", "float32"]  # QUICK's
    results = json.loads(output.read_text())
    assert results["machine"]["backend"]
    assert [row["tokens"] for row in results["layer"]] == ["8x8", "16x16"]
    for row in results["layer"]:
        assert row["fast_mode"] == "separable"
        assert row["fast_ms"] > 0 and row["general_ms"] > 0 and row["speedup"] > 0
        assert row["max_abs_difference"] <= 1e-5  # float32 layers, whatever the global policy
    assert {row["model"] for row in results["models"]} == {"quadratic_tiny", "resnet_tiny"}
    for row in results["models"]:
        assert row["images_per_second"] > 0 and row["matmul_gflops"] > 0 and 0 < row["fraction_of_matmul"]
    table = (tmp_path / "bench.md").read_text()
    assert "| tokens |" in table and "| model |" in table
    assert "speed-up" in capsys.readouterr().out
