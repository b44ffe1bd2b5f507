"""A model card's trained results are those of the repository's results files, and every finished run is on one."""

import json
from pathlib import Path

import pytest

import keras_attnconv

REPOSITORY = Path(__file__).parents[2]
TRAINED = [
    (name, result) for name in keras_attnconv.list_models() for result in keras_attnconv.get_model_card(name).trained
]


def _recorded_run(name, result):
    """``(accuracy, standard_error, epochs, minutes, device, data, beside)`` of `result`'s run, from its file.

    `beside`: the recipes that shared its device (none for a single run's record).
    """
    record = json.loads((REPOSITORY / result.results_file).read_text())
    if "runs" in record:  # a Table 1 file (`attnconv table1`)
        (run,) = [run for run in record["runs"] if run["recipe"] == result.recipe and run["model"] == name]
        return (
            run["test_accuracy"],
            run["standard_error"],
            run["epochs"],
            run["training_minutes"],
            run["device"],
            record["data"]["name"],
            tuple(run.get("trained_beside", [])),
        )
    metrics = record["metrics"]  # a single run's record (training/results/cifar10-cpu.json)
    assert metrics["model"] == name and f"--recipe {result.recipe} " in record["command"]
    return (
        metrics["eval_accuracy"],
        record["test_standard_error"],
        metrics["epochs"],
        metrics["wall_seconds_this_session"] / 60,
        f"{record['machine']['cpu']['model']}, {record['machine']['cpus']} cores",
        record["data"]["name"],
        (),  # a single run's record: it trained alone
    )


@pytest.mark.parametrize("name, result", TRAINED, ids=[f"{name}-{result.recipe}" for name, result in TRAINED])
def test_a_cards_trained_result_is_its_results_file(name, result):
    accuracy, standard_error, epochs, minutes, device, data, beside = _recorded_run(name, result)
    assert result.accuracy == round(accuracy, 4) and result.standard_error == round(standard_error, 4)
    assert (result.epochs, result.minutes, result.device, result.data) == (epochs, round(minutes, 1), device, data)
    assert result.beside == beside


def test_every_finished_table1_run_is_on_its_models_card():
    held = {(name, result.recipe, result.results_file) for name, result in TRAINED}
    for path in sorted((REPOSITORY / "training" / "results").glob("table1-*.json")):
        for run in json.loads(path.read_text())["runs"]:
            if run["finished"]:
                assert (run["model"], run["recipe"], str(path.relative_to(REPOSITORY))) in held, run["recipe"]
