"""`attnconv bench --suite numerics` (training.numerics): each precision trains, far centers and large grids agree."""

import json

from keras_attnconv import cli
from keras_attnconv.training import numerics
from keras_attnconv.utils.assets import SAMPLE_PATH
from keras_attnconv.utils.files import file_digest
from keras_attnconv.utils.reports import machine_text


def test_quick_numerics_suite_checks_every_precision(tmp_path, caplog):
    results = numerics.run_numerics(quick=True, output=str(tmp_path / "numerics.json"), run_dir=str(tmp_path / "runs"))
    # Its models each trace their own step, as meant: TensorFlow's warning about retracing is not printed.
    assert not [record for record in caplog.records if "retracing" in record.getMessage()]
    precisions = ["float32", "mixed_bfloat16", "mixed_float16"]
    assert [row["precision"] for row in results["training"]] == precisions
    assert results["training"][0]["points_from_float32"] == 0.0
    assert {(row["precision"], row["path"]) for row in results["far_centers"]} == {
        (precision, path) for precision in precisions for path in ("separable", "position", "windowed_position")
    }
    assert [(row["tokens"], row["precision"]) for row in results["large_grids"]] == [
        (f"{size}x{size}", precision) for size in numerics.NUMERICS_QUICK["sizes"] for precision in precisions
    ]
    assert results["ok"] and all(row["ok"] for row in results["large_grids"] + results["far_centers"])
    summary = (tmp_path / "numerics.md").read_text()
    assert "All checks passed: True." in summary
    # The data trained on, named, with the digest of the very file the runs read.
    crops = tmp_path / "runs" / "sample_8.npz"
    assert results["data"] == {
        "name": "cifar10_sample: the 8x8 center crops of its first 200 images",
        "file": "sample_8.npz",
        "digest": file_digest(crops),
    }
    assert f"read from `sample_8.npz` ({file_digest(crops)})" in summary
    # Which CPU, beside its figures: its model and what it has for bfloat16 and vectors.
    assert summary.startswith(f"Device: {results['device']['device']}: {machine_text(results['device'])};")


def test_a_failed_numerics_check_fails_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(numerics, "training_agreement", lambda **_: [])
    monkeypatch.setattr(numerics, "far_centers", lambda **_: [])
    monkeypatch.setattr(
        numerics,
        "large_grids",
        lambda **_: [
            {
                "tokens": "64x64",
                "batch": 8,
                "precision": "mixed_bfloat16",
                "relative_difference": 0.5,
                "tolerance": 0.03,
                "ok": False,
            }
        ],
    )
    output = tmp_path / "numerics.json"
    assert cli.main(["bench", "--suite", "numerics", "--quick", "--output", str(output)]) == 2
    assert f"a numerics check failed: see {output}" in capsys.readouterr().err
    assert json.loads(output.read_text())["ok"] is False  # the figures are kept


def test_a_non_finite_figure_is_written_as_its_name_and_fails_the_check(tmp_path, monkeypatch):
    """A NaN loss is what a failed check looks like: it is reported, not a crash at the end (JSON has no
    NaN, and the suite would lose every figure it had measured)."""
    monkeypatch.setattr(numerics, "training_agreement", lambda **_: [])
    monkeypatch.setattr(numerics, "large_grids", lambda **_: [])
    monkeypatch.setattr(numerics, "PRECISIONS", ("float32",))
    output = tmp_path / "numerics.json"
    # An infinite alpha makes each query's peak score -inf * 0: NaN, a real non-finite loss. (1e38 no longer does:
    # the other scores overflow to -inf, the peak stays an exact 0, and the softmax is one-hot.)
    results = numerics.run_numerics(quick=True, output=str(output), alpha=float("inf"))
    assert results["ok"] is False
    rows = json.loads(output.read_text())["far_centers"]
    assert [(row["path"], row["loss"], row["ok"]) for row in rows] == [
        ("separable", "nan", False),
        ("position", "nan", False),
        ("windowed_position", "nan", False),
    ]
    assert "| float32 | separable | nan | False |" in (tmp_path / "numerics.md").read_text()
    assert json.loads(output.read_text())["settings"]["alpha"] == "inf"


def test_the_full_suite_records_the_recipes_own_data_and_its_digest(tmp_path):
    """Without `--quick` the training check reads the recipe's dataset: the embedded sample's file for `quick`;
    a dataset that is not one file (a TFDS name) is named with no digest rather than a made-up one."""
    dataset, data = numerics.training_data(recipe="quick", run_dir=str(tmp_path))
    assert dataset == "cifar10_sample"
    assert data == {"name": "cifar10_sample", "file": "cifar10_sample.npz", "digest": file_digest(SAMPLE_PATH)}
    recipe = tmp_path / "tfds.toml"
    recipe.write_text('model = "quadratic_tiny"\ndataset = "cifar10"\n')
    assert numerics.training_data(recipe=str(recipe), run_dir=str(tmp_path)) == (
        "cifar10",
        {"name": "cifar10", "file": None, "digest": None},
    )
    assert numerics._data_text({"name": "cifar10", "file": None, "digest": None}) == "cifar10 (not one file: no digest)"
