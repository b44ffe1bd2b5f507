"""`attnconv compare`: every model trained with the same recipe, results tabulated."""

import json

import pytest

from keras_attnconv.comparison import compare_models

MODELS = ("quadratic_span_tiny", "absolute_sinusoid_tiny")


@pytest.fixture
def recipe(small_npz, tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(f'dataset = "{small_npz}"\nepochs = 1\nbatch_size = 40\njit_compile = false\nverbose = 0\n'
                    'seed = 3\nmodel_overrides = {num_layers = 1, hidden_dim = 8, intermediate_dim = 8}\n')
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
