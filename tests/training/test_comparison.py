"""`attnconv compare`: every model trained with the same recipe, results tabulated."""

import json

import pytest
from support import run_until_killed

from keras_attnconv.training.comparison import compare_models
from keras_attnconv.training.run_directory import RunDirectory

MODELS = ("quadratic_span_tiny", "absolute_sinusoid_tiny")


@pytest.fixture
def recipe(small_npz, tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(
        f'dataset = "{small_npz}"\nepochs = 1\nbatch_size = 40\njit_compile = false\nverbose = 0\n'
        "seed = 3\nmodel_overrides = {num_layers = 1, hidden_dim = 8, intermediate_dim = 8}\n"
    )
    return path


def test_every_model_is_trained_with_the_same_recipe(recipe, tmp_path):
    output = tmp_path / "compare.json"
    results = compare_models(recipe, models=MODELS, output=output, runs_dir=str(tmp_path / "runs"))
    assert [row["model"] for row in results["rows"]] == list(MODELS)
    assert json.loads(output.read_text()) == results
    configs = [json.loads((tmp_path / "runs" / f"compare-{m}" / "config.json").read_text()) for m in MODELS]
    assert [c["model"] for c in configs] == list(MODELS)
    for key in ("dataset", "epochs", "batch_size", "seed", "learning_rate", "model_overrides"):
        assert configs[0][key] == configs[1][key], key
    for row in results["rows"]:
        metrics = json.loads((tmp_path / "runs" / f"compare-{row['model']}" / "metrics.json").read_text())
        assert row["eval_accuracy"] == metrics["eval_accuracy"] and 0.0 <= row["eval_accuracy"] <= 1.0
    table = output.with_suffix(".md").read_text()
    assert all(f"| `{m}` |" in table for m in MODELS)


def test_a_comparison_run_again_takes_the_finished_runs_and_trains_the_rest(recipe, tmp_path, monkeypatch):
    from keras_attnconv.training import fit

    runs = str(tmp_path / "runs")
    first = compare_models(recipe, models=MODELS[:1], output=tmp_path / "first.json", runs_dir=runs)
    trained = []
    real_train = fit.train
    monkeypatch.setattr(fit, "train", lambda config: trained.append(config.model) or real_train(config))
    again = compare_models(recipe, models=MODELS, output=tmp_path / "again.json", runs_dir=runs)
    assert trained == [MODELS[1]]  # the first model's finished run is read, not trained into compare-<model>-1
    assert again["rows"][0] == first["rows"][0]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(f"compare-{m}" for m in MODELS)


@pytest.mark.parametrize(
    "models, message",
    [
        ((), "models=()"),
        ([""], "models=\\[''\\]"),
        ("quadratic_tiny", "models='quadratic_tiny'"),
    ],
)
def test_no_model_to_compare_is_an_error(recipe, tmp_path, models, message):
    with pytest.raises(ValueError, match=f"must name at least one model. Received: {message}"):
        compare_models(recipe, models=models, output=tmp_path / "c.json", runs_dir=str(tmp_path / "runs"))
    assert list(tmp_path.iterdir()) == [recipe]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"output": "file/c.json"}, "is a file, not a directory"),
        ({"model_overrides": {"hidden_dim": 0}}, "hidden_dim=0"),
    ],
)
def test_everything_is_checked_before_the_first_model_trains(recipe, tmp_path, bad, message, monkeypatch):
    from keras_attnconv.training import fit

    (tmp_path / "file").write_text("")
    monkeypatch.setattr(fit, "train", lambda config: pytest.fail("trained before the checks"))
    output = tmp_path / bad.pop("output", "c.json")
    with pytest.raises((ValueError, OSError), match=message):
        compare_models(recipe, models=MODELS, output=output, runs_dir=str(tmp_path / "runs"), **bad)
    assert not (tmp_path / "runs").exists()


def test_the_data_is_loaded_once_to_check_every_model(recipe, tmp_path, monkeypatch):
    """The checks before training load each split once and compute the statistics once, not once per model, and
    still check every model."""
    from keras_attnconv import models
    from keras_attnconv.training import data, fit

    class Checked(Exception):
        pass

    loaded, checked, computed = [], [], []
    load_arrays, get_model_config, statistics = data.load_arrays, models.get_model_config, data._channel_statistics
    data._read_npz_info.cache_clear()  # (an earlier test may have read the file)

    def recording_load_arrays(name, split, **kwargs):
        loaded.append(split)
        return load_arrays(name, split, **kwargs)

    def recording_get_model_config(name, **fields):
        checked.append(name)
        return get_model_config(name, **fields)

    def stop_at_training(config):
        raise Checked

    monkeypatch.setattr(data, "load_arrays", recording_load_arrays)
    monkeypatch.setattr(data, "_channel_statistics", lambda images: computed.append(images.shape) or statistics(images))
    monkeypatch.setattr(models, "get_model_config", recording_get_model_config)
    monkeypatch.setattr(fit, "train", stop_at_training)
    with pytest.raises(Checked):
        compare_models(recipe, models=MODELS, output=tmp_path / "c.json", runs_dir=str(tmp_path / "runs"))
    assert sorted(loaded) == ["test", "train"]
    assert checked == list(MODELS)
    assert computed == [(160, 8, 8, 3)]  # the pixel statistics, once, of the training images


def table_results(rows, machine=None):
    """The results of a comparison of `rows` (recipe r.toml on d, 1 epoch, float32, seed 0), as `markdown_table`
    takes them; `machine` defaults to a record of the CPU count alone, as files written before the device have."""
    return {
        "recipe": "r.toml",
        "dataset": "d",
        "epochs": 1,
        "precision": "float32",
        "seed": 0,
        "eval_split": "validation",
        "machine": machine or {"cpus": 2, "keras": "3", "backend": "jax"},
        "rows": rows,
    }


def test_the_table_sets_each_local_model_beside_its_global_twin():
    from keras_attnconv.training.comparison import markdown_table

    def row(model, accuracy, speed):
        return {
            "model": model,
            "description": model,
            "trainable_parameters": 1000,
            "eval_accuracy": accuracy,
            "best_val_accuracy": accuracy,
            "train_images_per_second": speed,
            "wall_seconds": 60,
        }

    results = table_results([row("a_tiny", 0.25, 200), row("a_local_tiny", 0.3, 100), row("b_local_tiny", 0.2, 50)])
    table = markdown_table(results)
    assert "| `a_local_tiny` | 30.0% | 100 | `a_tiny` | 25.0% | 200 |" in table
    assert "`b_local_tiny` | 20.0% | 50 | `" not in table  # no twin ran: no pair
    assert "twin" not in markdown_table({**results, "rows": results["rows"][:1]})


def test_the_table_names_the_device_its_speeds_were_measured_on():
    # Images per second mean nothing without the device: a CPU's model and its bfloat16 and vector units, a GPU's name.
    from keras_attnconv.training.comparison import markdown_table
    from keras_attnconv.utils.reports import cpu_capabilities, device_description

    header = markdown_table(table_results([], device_description())).splitlines()[0]
    cpu = cpu_capabilities()
    assert f"(cpu): {cpu['model']}" in header and f"bfloat16 units: {cpu['bfloat16_units'] or 'none'}" in header
    gpu = {**device_description(), "device": "NVIDIA H100 80GB HBM3 (gpu)"}
    assert "; NVIDIA H100 80GB HBM3 (gpu), Keras " in markdown_table(table_results([], gpu))
    # A file written before the device was recorded keeps its line.
    assert "; 2 CPUs, Keras 3 on jax." in markdown_table(table_results([]))


KILLED_COMPARISON = """
from keras_attnconv.training import run_directory
from keras_attnconv.training.comparison import compare_models

die_before(run_directory.RunDirectory, 'write_metrics')  # after the last backup and the preset
compare_models({recipe!r}, models={models!r}, output={output!r}, runs_dir={runs!r})
"""


def test_a_run_killed_before_its_metrics_keeps_its_images_per_second_and_the_comparison_completes(recipe, tmp_path):
    runs, models = str(tmp_path / "runs"), list(MODELS[:1])
    run_until_killed(
        KILLED_COMPARISON.format(recipe=str(recipe), models=models, output=str(tmp_path / "c.json"), runs=runs)
    )
    run = RunDirectory(tmp_path / "runs" / f"compare-{models[0]}")
    assert run.has_completed_epoch() and not run.is_finished()
    results = compare_models(recipe, models=models, output=tmp_path / "c.json", runs_dir=runs)
    (row,) = results["rows"]
    assert row["train_images_per_second"] > 0  # measured by the killed process, resumed after its last epoch
    assert (
        json.loads((run.path / "metrics.json").read_text())["train_images_per_second"] == row["train_images_per_second"]
    )


def test_the_table_shows_a_figure_a_finished_run_lacks_as_a_dash():
    from keras_attnconv.training.comparison import markdown_table

    rows = [
        {
            "model": name,
            "description": name,
            "trainable_parameters": 1000,
            "eval_accuracy": 0.25,
            "best_val_accuracy": None,
            "train_images_per_second": None,
            "wall_seconds": 60,
        }
        for name in ("a_tiny", "a_local_tiny")
    ]
    table = markdown_table(table_results(rows))
    assert table.startswith("Recipe `r.toml` (d, 1 epoch, float32, seed 0)")  # not "1 epochs"
    assert "| final accuracy | best epoch's accuracy |" in table  # the best epoch's is an accuracy, not a number
    assert "| `a_tiny` | a_tiny | 1k | 25.0% | - | - | 1.0 min |" in table
    assert "| `a_local_tiny` | 25.0% | - | `a_tiny` | 25.0% | - |" in table


def test_an_output_named_for_either_format_writes_both_files(recipe, tmp_path, capsys):
    from keras_attnconv import cli

    assert (
        cli.main(
            [
                "compare",
                "--recipe",
                str(recipe),
                "--models",
                MODELS[0],
                "--runs-dir",
                str(tmp_path / "runs"),
                "--output",
                str(tmp_path / "res.md"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'res.json'} and {tmp_path / 'res.md'}" in out
    assert f"drew {tmp_path / 'res.png'} and {tmp_path / 'res.svg'}" in out  # the table as a chart, beside it
    assert (tmp_path / "res.png").read_bytes()[:4] == b"\x89PNG" and b"<svg" in (tmp_path / "res.svg").read_bytes()
    assert json.loads((tmp_path / "res.json").read_text())["rows"][0]["model"] == MODELS[0]
    assert (tmp_path / "res.md").read_text().startswith("Recipe ")
