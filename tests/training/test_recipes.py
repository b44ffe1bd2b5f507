"""Recipes are package data, addressed by name: `attnconv train --recipe quadratic`; a path still works."""

import dataclasses
import re
from pathlib import Path

import pytest

from keras_attnconv import cli
from keras_attnconv.models import get_model_card, get_paper_figures
from keras_attnconv.training.recipe import RECIPES_DIR, load_recipe, recipe_names


def test_every_recipe_file_of_the_package_is_a_recipe_name():
    assert recipe_names() == sorted(path.stem for path in RECIPES_DIR.glob("*.toml"))
    assert {"quick", "quadratic", "learned_content", "gaussian", "resnet18"} <= set(recipe_names())


@pytest.mark.parametrize("name", ["quick", "quadratic", "resnet18"])
def test_a_recipe_by_name_is_the_recipe_of_its_file(name):
    assert load_recipe(name) == load_recipe(RECIPES_DIR / f"{name}.toml")
    assert load_recipe(name).name == name


def test_an_unknown_recipe_name_suggests_the_closest_and_lists_them():
    with pytest.raises(
        FileNotFoundError,
        match=r"No recipe named 'quadratc'\. Did you mean 'quadratic'.*quick.*"
        r"Received: recipe='quadratc'",
    ):
        load_recipe("quadratc")


def test_a_path_is_a_file_of_the_users_even_when_named_like_a_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quadratic.toml").write_text('model = "quadratic_tiny"\nepochs = 2\n')
    assert load_recipe("./quadratic.toml").epochs == 2 and load_recipe("quadratic.toml").epochs == 2
    assert load_recipe("quadratic").epochs == 300  # the name: the package's
    with pytest.raises(FileNotFoundError, match="No recipe at 'missing.toml'"):
        load_recipe("missing.toml")


def test_the_run_is_named_after_the_recipe_only_while_the_model_is_the_recipes():
    assert load_recipe("quick").name == "quick"
    assert load_recipe("quick", model="quadratic_tiny").name == "quick"  # its own model, given again
    assert load_recipe("quick", model="learned_tiny").name == "learned_tiny"
    assert load_recipe("quick", model="learned_tiny", name="mine").name == "mine"  # a name given is the name


def test_a_recipe_by_name_trains_from_the_command_line(monkeypatch):
    from keras_attnconv.training import workflow

    given = {}
    monkeypatch.setattr(workflow, "train_and_export", lambda config: given.setdefault("config", config) and {})
    assert cli.main(["train", "--recipe", "quick", "--epochs", "1"]) == 0
    assert dataclasses.replace(given["config"], epochs=8, verbose=1) == load_recipe("quick")


def test_attnconv_recipes_lists_each_recipe_with_its_paper_row(capsys):
    assert cli.main(["recipes"]) == 0
    out = capsys.readouterr().out
    for name in recipe_names():
        config = load_recipe(name)
        row = f"| {name} | `{config.model}` | {config.dataset} | {config.epochs} | "
        assert row in out and get_paper_figures(config.model).row in out, name


def test_models_md_lists_every_recipe_under_the_family_of_the_configuration_it_trains():
    text = (Path(__file__).parents[2] / "docs" / "models.md").read_text()
    section = text[text.index("## Recipes by family") : text.index("## The zoo")]
    listed = {}
    for family, table in re.findall(r"^`(\w+)` \(`keras_attnconv/models/\w+/`\):\n\n(.*?)\n\n", section, re.S | re.M):
        for recipe, model in re.findall(r"^\| `(\w+)` \| `(\w+)` \|$", table, re.M):
            listed[recipe] = (family, model)
    expected = {}
    for path in RECIPES_DIR.glob("*.toml"):
        model = load_recipe(path.stem).model
        expected[path.stem] = (get_model_card(model).family, model)
    assert listed == expected


def test_train_help_says_what_each_recipe_field_is():
    # `attnconv train --help` shows a line per field: a field added without one would have a blank line.
    from keras_attnconv.training.recipe import FIELD_MEANINGS, TrainConfig

    assert list(FIELD_MEANINGS) == [field.name for field in dataclasses.fields(TrainConfig)]
    parser = cli.build_parser()
    commands = next(action for action in parser._actions if action.dest == "command")
    helps = {action.dest: action.help for action in commands.choices["train"]._actions}
    assert helps["epochs"] == "epochs of training (recipe field epochs, default 300)"
    assert all(helps[field].startswith(FIELD_MEANINGS[field]) for field in FIELD_MEANINGS)
