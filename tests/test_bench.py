"""`attnconv bench --quick` runs and writes a well-formed JSON and table."""

import json

from keras_attnconv import cli


def test_quick_benchmark_writes_json_and_markdown(tmp_path, capsys):
    output = tmp_path / "bench.json"
    assert cli.main(["bench", "--quick", "--output", str(output)]) == 0
    results = json.loads(output.read_text())
    assert results["machine"]["backend"]
    assert [row["tokens"] for row in results["layer"]] == ["8x8", "16x16"]
    for row in results["layer"]:
        assert row["fast_mode"] == "separable"
        assert row["fast_ms"] > 0 and row["general_ms"] > 0 and row["speedup"] > 0
        assert row["max_abs_difference"] <= 1e-5
    assert {row["model"] for row in results["models"]} == {"quadratic_tiny", "resnet_tiny"}
    for row in results["models"]:
        assert row["images_per_second"] > 0 and row["matmul_gflops"] > 0 and 0 < row["fraction_of_matmul"]
    table = (tmp_path / "bench.md").read_text()
    assert "| tokens |" in table and "| model |" in table
    assert "speed-up" in capsys.readouterr().out
