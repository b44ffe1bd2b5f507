"""Specifications of the training choices' results file: each run's changes and gain over a base run of real runs."""

import json
import math
import shutil

import pytest
from support import small_quadratic_run

from keras_attnconv.cli import main
from keras_attnconv.training.choice_gains import (
    choice_gains_markdown,
    choice_gains_report,
    setting_changes,
    variant_label,
)
from keras_attnconv.training.table1 import table1_report

DATA = {"data_name": "the small sample"}


@pytest.fixture(scope="module")
def runs(small_npz, tmp_path_factory):
    """A base run and two runs with settings changed: label smoothing, and another seed."""
    root = tmp_path_factory.mktemp("choices")
    return {
        "base": small_quadratic_run(root / "base", small_npz),
        "smoothed": small_quadratic_run(root / "smoothed", small_npz, label_smoothing=0.1),
        "seed": small_quadratic_run(root / "seed", small_npz, seed=1),
    }


def metrics_of(run):
    return json.loads((run / "metrics.json").read_text())


def test_each_run_records_its_changes_and_its_gain_over_the_base_with_the_standard_errors_in_quadrature(
    runs, small_npz
):
    report = choice_gains_report([runs["smoothed"], runs["seed"]], base=runs["base"], data_file=small_npz, **DATA)
    base, smoothed, seed = (metrics_of(runs[name]) for name in ("base", "smoothed", "seed"))
    assert report["base"]["test_accuracy"] == base["eval_accuracy"]
    assert [run["changes"] for run in report["runs"]] == [{"label_smoothing": 0.1}, {"seed": 1}]
    assert [run["variant"] for run in report["runs"]] == ["label_smoothing 0.1", "seed 1"]
    for run, metrics in zip(report["runs"], (smoothed, seed)):
        assert run["gain_points"] == pytest.approx(100 * (metrics["eval_accuracy"] - base["eval_accuracy"]))
        n = metrics["eval_examples"]
        errors = [math.sqrt(a * (1 - a) / n) for a in (metrics["eval_accuracy"], base["eval_accuracy"])]
        assert run["gain_standard_error_points"] == pytest.approx(100 * math.hypot(*errors))
        assert run["final_training_accuracy"] == metrics["history"]["accuracy"][-1]
    markdown = choice_gains_markdown(report)
    first = report["runs"][0]
    row = (
        f"| label_smoothing 0.1 | {100 * first['test_accuracy']:.2f}% ± {100 * first['standard_error']:.2f}% | "
        f"{first['gain_points']:+.2f} ± {first['gain_standard_error_points']:.2f} |"
    )
    assert row in markdown


def test_a_base_from_a_table1_results_file_gives_the_gains_of_its_run_directory(runs, small_npz, tmp_path):
    # The run of an earlier session, recorded in Table 1's file, is a base without training it again.
    table1 = table1_report([runs["base"]], data_name="the small sample", data_file=small_npz, device="a CPU")
    results = tmp_path / "table1.json"
    results.write_text(json.dumps(table1))
    from_file = choice_gains_report([runs["smoothed"]], base=results, data_file=small_npz, **DATA)
    from_directory = choice_gains_report([runs["smoothed"]], base=runs["base"], data_file=small_npz, **DATA)
    assert from_file["runs"][0]["gain_points"] == from_directory["runs"][0]["gain_points"]
    assert from_file["runs"][0]["changes"] == {"label_smoothing": 0.1}


def test_a_setting_recorded_before_it_existed_counts_at_what_the_package_did_then():
    recorded_before = {"epochs": 60, "seed": 0}  # a run of before the cutout field
    assert setting_changes(recorded_before, {"epochs": 60, "seed": 0, "cutout": 0}) == {}
    assert setting_changes(recorded_before, {"epochs": 60, "seed": 0, "cutout": 16}) == {"cutout": 16}
    assert setting_changes({"name": "a"}, {"name": "b"}) == {}  # a name is no choice
    assert variant_label({}) == "the base's settings (a rerun)"


def test_update_keeps_the_earlier_runs_unless_a_run_makes_the_same_changes(runs, small_npz):
    earlier = choice_gains_report([runs["smoothed"], runs["seed"]], base=runs["base"], data_file=small_npz, **DATA)
    earlier["runs"][0]["test_accuracy"] = -1.0  # marks the earlier label-smoothing row
    updated = choice_gains_report(
        [runs["smoothed"]], base=runs["base"], data_file=small_npz, earlier=earlier, command="second", **DATA
    )
    assert [run["variant"] for run in updated["runs"]] == ["seed 1", "label_smoothing 0.1"]
    assert updated["runs"][1]["test_accuracy"] >= 0 and updated["commands"] == [None, "second"]


def test_runs_that_cannot_give_a_gain_are_refused_by_name(runs, small_npz, tmp_path):
    stopped = tmp_path / "stopped"
    shutil.copytree(runs["smoothed"], stopped)
    (stopped / "metrics.json").unlink()
    with pytest.raises(ValueError, match=r"is not finished .*Received: run='.*stopped'"):
        choice_gains_report([stopped], base=runs["base"], data_file=small_npz, **DATA)
    with pytest.raises(ValueError, match=r"The base is also among the runs"):
        choice_gains_report([runs["base"]], base=runs["base"], data_file=small_npz, **DATA)
    with pytest.raises(ValueError, match=r"Name at least one run"):
        choice_gains_report([], base=runs["base"], data_file=small_npz, **DATA)
    other_data = tmp_path / "other.npz"
    other_data.write_bytes(b"other data")
    table1 = table1_report([runs["base"]], data_name="x", data_file=small_npz, device="a CPU")
    results = tmp_path / "table1.json"
    results.write_text(json.dumps(table1))
    with pytest.raises(ValueError, match=r"measured on other data .*Received: base="):
        choice_gains_report([runs["smoothed"]], base=results, data_file=other_data, **DATA)
    table1["runs"][0]["model"] = "resnet18"
    results.write_text(json.dumps(table1))
    with pytest.raises(ValueError, match=r"holds no finished run of `quadratic`"):
        choice_gains_report([runs["smoothed"]], base=results, data_file=small_npz, **DATA)
    earlier = choice_gains_report([runs["seed"]], base=runs["base"], data_file=small_npz, **DATA)
    earlier["base"]["test_accuracy"] = -1.0
    with pytest.raises(ValueError, match=r"another base run"):
        choice_gains_report([runs["smoothed"]], base=runs["base"], data_file=small_npz, earlier=earlier, **DATA)


def test_runs_of_another_model_than_the_base_are_refused(runs, small_npz, tmp_path):
    other = tmp_path / "other_model"
    shutil.copytree(runs["smoothed"], other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model": "learned"}))
    with pytest.raises(ValueError, match=r"The base trains `quadratic`, the runs `learned`"):
        choice_gains_report([other], base=runs["base"], data_file=small_npz, **DATA)
    with pytest.raises(ValueError, match=r"The runs train different models \(learned, quadratic\)"):
        choice_gains_report([other, runs["seed"]], base=runs["base"], data_file=small_npz, **DATA)


def test_a_run_evaluated_on_another_test_set_than_the_base_is_refused(runs, small_npz, tmp_path):
    # Fine-tuned on an image folder of its own: the data's path is no setting, the size of its test set tells.
    other = tmp_path / "other_data"
    shutil.copytree(runs["smoothed"], other)
    metrics = metrics_of(other)
    (other / "metrics.json").write_text(json.dumps({**metrics, "eval_examples": 32}))
    with pytest.raises(
        ValueError, match=rf"'{other}' was evaluated on 32 test images, the base on {metrics['eval_examples']}: "
    ):
        choice_gains_report([runs["seed"], other], base=runs["base"], data_file=small_npz, **DATA)


def test_the_command_writes_the_results_and_its_table(runs, small_npz, tmp_path, capsys):
    output = tmp_path / "choices.json"
    arguments = ["choices", str(runs["smoothed"]), "--base", str(runs["base"]), "--data-file", small_npz]
    assert main([*arguments, "--data-name", "the small sample", "--output", str(output)]) == 0
    results = json.loads(output.read_text())
    assert results["runs"][0]["variant"] == "label_smoothing 0.1" and results["package"]["version"]
    assert "| label_smoothing 0.1 |" in (tmp_path / "choices.md").read_text()
    assert "| label_smoothing 0.1 |" in capsys.readouterr().out
    assert main([*arguments[:1], str(runs["seed"]), *arguments[2:], "--data-name", "x", "--output", str(output),
                 "--update"]) == 0  # fmt: skip
    assert [run["variant"] for run in json.loads(output.read_text())["runs"]] == ["label_smoothing 0.1", "seed 1"]


def test_the_table_says_which_machine_each_run_trained_on(runs, small_npz):
    from keras_attnconv.utils.reports import device_text

    report = choice_gains_report([runs["smoothed"]], base=runs["base"], data_file=small_npz, **DATA)
    machine = device_text(metrics_of(runs["base"])["machine"])  # on a CPU: its model and bfloat16 units
    assert report["base"]["machine"] == report["runs"][0]["machine"] == machine
    assert f"\nMachine: {machine}.\n" in choice_gains_markdown(report)


def test_a_digest_is_labelled_by_its_first_twelve_digits():
    digest = "sha256:" + "0123456789ab" + "f" * 52
    assert variant_label({"init_from": "runs/base", "init_from_digest": digest}) == (
        'init_from "runs/base", init_from_digest "sha256:0123456789ab..."'
    )
