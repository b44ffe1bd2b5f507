"""Specifications of the Table 1 results file: what it records of real runs, and the runs it refuses."""

import dataclasses
import json
import math
import shutil

import pytest
from support import small_quadratic_run

from keras_attnconv.cli import main
from keras_attnconv.models import get_paper_figures
from keras_attnconv.training.recipe import load_recipe
from keras_attnconv.training.table1 import (
    TABLE1_HEADER,
    changes_from_recipe,
    table1_markdown,
    table1_report,
    table1_rows,
)

REPORT = {"data_name": "the small sample", "commit": "abc1234", "libraries": "keras 3"}


@pytest.fixture(scope="module")
def finished_run(small_npz, tmp_path_factory):
    """A real run of `quadratic` (its config shrunk), so that its row is Table 1's quadratic row."""
    return small_quadratic_run(tmp_path_factory.mktemp("table1") / "quadratic_small", small_npz)


def stopped_copy(run_dir, path):
    """`run_dir` as a run stopped after its epochs: no ``metrics.json`` (a kill before it was written)."""
    shutil.copytree(run_dir, path)
    (path / "metrics.json").unlink()
    return path


def test_a_finished_run_is_its_models_row_with_the_standard_error_of_its_accuracy(finished_run, small_npz):
    report = table1_report([finished_run], data_file=small_npz, device="a CPU", **REPORT)
    metrics = json.loads((finished_run / "metrics.json").read_text())
    (run,) = report["runs"]
    assert (run["recipe"], run["model"], run["finished"]) == ("quadratic_small", "quadratic", True)
    accuracy, examples = metrics["eval_accuracy"], metrics["eval_examples"]
    assert (run["test_accuracy"], run["test_examples"]) == (accuracy, examples)
    assert run["standard_error"] == pytest.approx(math.sqrt(accuracy * (1 - accuracy) / examples))
    assert run["history"] == metrics["history"] and len(run["history"]["val_accuracy"]) == 2
    assert run["paper_accuracy"] == get_paper_figures("quadratic").accuracy == 0.938
    assert run["training_minutes"] == pytest.approx(metrics["wall_seconds_this_session"] / 60)
    assert "run_dir" not in run["settings"] and run["settings"]["epochs"] == 2
    assert report["not_measured"] == ["resnet18", "learned", "learned_content"]
    assert report["data"]["digest"].startswith("sha256:") and report["data"]["file"] == "small.npz"


def test_runs_trained_side_by_side_name_each_other_beside_their_minutes(finished_run, small_npz, tmp_path):
    other = stopped_copy(finished_run, tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "name": "other"}))
    runs = [finished_run, other]
    report = table1_report(runs, data_file=small_npz, device="a CPU", side_by_side=True, **REPORT)
    assert [r["trained_beside"] for r in report["runs"]] == [["other"], ["quadratic_small"]]
    minutes = f"{report['runs'][0]['training_minutes']:.1f}"
    assert {row[0]: row for row in table1_rows(report)}["`quadratic`"][6] == f"{minutes} (beside `other`)"
    assert "beside: trained at the same time on the same device" in table1_markdown(report)
    alone = table1_report(runs, data_file=small_npz, device="a CPU", **REPORT)
    assert [r["trained_beside"] for r in alone["runs"]] == [[], []]
    assert {row[0]: row for row in table1_rows(alone)}["`quadratic`"][6] == minutes
    assert "beside" not in table1_markdown(alone)


def test_the_front_pages_rows_give_the_paper_beside_the_run_or_say_not_trained_yet(finished_run, small_npz):
    report = table1_report([finished_run], data_file=small_npz, device="a CPU", **REPORT)
    rows = {row[0]: row for row in table1_rows(report)}
    assert len(TABLE1_HEADER.split("|")) - 2 == len(rows["`quadratic`"])
    run = report["runs"][0]
    assert rows["`quadratic`"][1:3] == [
        "93.8%",
        f"{100 * run['test_accuracy']:.2f}% ± {100 * run['standard_error']:.2f}%",
    ]
    assert rows["`quadratic`"][3] == f"{100 * (run['test_accuracy'] - 0.938):+.1f}"
    assert rows["`resnet18`"][1:3] == ["93.8%", "not trained yet"]


def test_a_recipe_changed_on_the_command_line_is_never_shown_as_the_recipe(finished_run, small_npz):
    where = {"run_dir": "runs/quadratic_fast", "runs_dir": "runs", "dataset": "c10.npz", "verbose": 2}
    as_is = {**dataclasses.asdict(load_recipe("quadratic_fast")), **where}
    changed = {**dataclasses.asdict(load_recipe("quadratic_fast", epochs=20, label_smoothing=0.1)), **where}
    assert changes_from_recipe(as_is) == {}  # where it ran is no change
    assert changes_from_recipe(changed) == {"epochs": 20, "label_smoothing": 0.1}
    assert changes_from_recipe({**changed, "name": "mine"}) is None  # a name of the user's: no recipe to compare
    report = table1_report([finished_run], data_file=small_npz, device="a CPU", **REPORT)
    report["runs"][0].update(recipe="quadratic_fast", changes=changes_from_recipe(changed))
    label = "`quadratic_fast` (changed: epochs 20, label_smoothing 0.1)"
    assert {row[0]: row for row in table1_rows(report)}["`quadratic`"][4] == label
    assert f"- {label}: package commit" in table1_markdown(report)


def test_a_stopped_run_gives_the_epochs_it_completed_and_no_row(finished_run, small_npz, tmp_path):
    stopped = stopped_copy(finished_run, tmp_path / "stopped")
    report = table1_report([stopped], data_file=small_npz, device="a CPU", **REPORT)
    (run,) = report["runs"]
    assert (run["finished"], run["epochs_completed"]) == (False, 2) and "test_accuracy" not in run
    assert "quadratic" in report["not_measured"]


def test_two_finished_runs_of_one_model_are_refused(finished_run, small_npz, tmp_path):
    copy = tmp_path / "again"
    shutil.copytree(finished_run, copy)
    with pytest.raises(ValueError, match="Two finished runs train quadratic"):
        table1_report([finished_run, copy], data_file=small_npz, device="a CPU", **REPORT)


def test_a_run_of_a_model_that_is_not_in_table_1_is_refused(finished_run, small_npz, tmp_path):
    tiny = tmp_path / "quick"  # the run of another model: its config says so
    shutil.copytree(finished_run, tiny)
    config = json.loads((tiny / "config.json").read_text())
    (tiny / "config.json").write_text(json.dumps({**config, "model": "quadratic_tiny"}))
    with pytest.raises(
        ValueError, match=rf"'{tiny}' trains quadratic_tiny, which is not a model of Table 1 \(resnet18,"
    ):
        table1_report([finished_run, tiny], data_file=small_npz, device="a CPU", **REPORT)


def test_a_run_records_its_device_libraries_and_commit_for_the_results(finished_run, small_npz):
    metrics = json.loads((finished_run / "metrics.json").read_text())
    if metrics["package"]["commit"] is None:  # the tests ran from an installed package, not from a checkout
        with pytest.raises(ValueError, match="does not record the package's commit"):
            table1_report([finished_run], data_file=small_npz, data_name="the small sample")
        return
    (run,) = table1_report([finished_run], data_file=small_npz, data_name="the small sample")["runs"]
    machine = metrics["machine"]
    assert run["device"] == machine["device"] and f"keras {machine['keras']}" in run["libraries"]
    assert run["commit"] == metrics["package"]["commit"]


def test_a_run_that_does_not_record_its_device_needs_it_named(finished_run, small_npz, tmp_path):
    older = tmp_path / "older"  # a run from before runs recorded their machine
    shutil.copytree(finished_run, older)
    metrics = json.loads((older / "metrics.json").read_text())
    del metrics["machine"]
    (older / "metrics.json").write_text(json.dumps(metrics))
    with pytest.raises(ValueError, match="does not record its device"):
        table1_report([older], data_file=small_npz, **REPORT)
    (run,) = table1_report([older], data_file=small_npz, device="a CPU", **REPORT)["runs"]
    assert (run["device"], run["libraries"]) == ("a CPU", "keras 3")


def test_a_folder_that_is_no_run_is_named(tmp_path, small_npz):
    (tmp_path / "notes").mkdir()
    with pytest.raises(ValueError, match="notes.*is not a training run"):
        table1_report([tmp_path / "notes"], data_file=small_npz, device="a CPU", **REPORT)


def test_the_command_writes_the_results_file_and_its_table(finished_run, small_npz, tmp_path, capsys):
    output = tmp_path / "table1-cpu.json"
    code = main(
        [
            "table1",
            str(finished_run),
            "--data-name",
            "the small sample",
            "--data-file",
            small_npz,
            "--commit",
            "abc1234",
            "--libraries",
            "keras 3",
            "--device",
            "a CPU",
            "--output",
            str(output),
        ]
    )
    assert code == 0
    results = json.loads(output.read_text())
    (command,) = results["commands"]
    assert command.startswith("attnconv table1 ") and "'the small sample'" in command
    assert TABLE1_HEADER in output.with_suffix(".md").read_text()


def test_update_keeps_the_earlier_sessions_runs_unless_a_run_of_their_recipe_replaces_them(
    finished_run, small_npz, tmp_path
):
    output = tmp_path / "table1-cpu.json"
    common = [
        "--data-name",
        "the small sample",
        "--data-file",
        small_npz,
        "--commit",
        "abc1234",
        "--output",
        str(output),
    ]
    assert main(["table1", str(finished_run), *common]) == 0
    other = stopped_copy(finished_run, tmp_path / "other")  # another recipe, trained in a later session
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "name": "other"}))
    # A stopped run never wrote its metrics, nor the device they record.
    assert main(["table1", str(other), *common, "--commit", "def5678", "--device", "a CPU", "--update"]) == 0
    results = json.loads(output.read_text())
    assert [(r["recipe"], r["finished"], r["commit"]) for r in results["runs"]] == [
        ("quadratic_small", True, "abc1234"),
        ("other", False, "def5678"),
    ]
    assert len(results["commands"]) == 2 and "quadratic" not in results["not_measured"]
    again = stopped_copy(finished_run, tmp_path / "again")  # the same recipe again: it replaces the earlier run
    assert main(["table1", str(again), *common, "--device", "a CPU", "--update"]) == 0
    assert [r["recipe"] for r in json.loads(output.read_text())["runs"]] == ["other", "quadratic_small"]


def test_update_refuses_results_measured_on_other_data(finished_run, small_npz, tmp_path):
    earlier = table1_report([finished_run], data_file=small_npz, **REPORT)
    other_data = tmp_path / "other.npz"
    other_data.write_bytes(b"other data")
    with pytest.raises(ValueError, match="measured on other data"):
        table1_report([finished_run], data_file=other_data, earlier=earlier, **REPORT)


def test_a_run_gives_what_test_time_flips_gain_on_its_last_weights(finished_run, small_npz):
    metrics = json.loads((finished_run / "metrics.json").read_text())
    report = table1_report([finished_run], data_file=small_npz, device="a CPU", **REPORT)
    flips = report["runs"][0]["test_time_flips"]
    assert flips == metrics["eval_accuracy_by_test_time_flips"] and flips["examples"] == metrics["eval_examples"]
    gain = f"({100 * flips['gain']:+.2f} ± {100 * flips['gain_standard_error']:.2f} points)"
    assert f"test-time flips {100 * flips['without']:.2f}% -> {100 * flips['with']:.2f}% {gain}" in table1_markdown(
        report
    )
