"""The run directory's owner: a run is written only where nothing is, or where a run of the package is; a user's
folder, a preset or an export root given as a run directory is an error naming it, with nothing changed; a kill at
any moment of the run's creation or completion leaves a state that the same command carries on from."""

import ast
import json
import os
import re
import shutil
import socket
from pathlib import Path

import pytest
import support
from support import run_until_killed, snapshot, tiny_train_command

from keras_attnconv import build_model, cli, save_to_preset
from keras_attnconv.export.root import ExportRoot
from keras_attnconv.training.fit import train
from keras_attnconv.training.run_directory import RunDirectory
from keras_attnconv.utils.ownership import MARKER, ForeignDirectoryError, mark_of, write_mark

SMALL_MODEL = {"num_layers": 1, "hidden_dim": 8, "intermediate_dim": 8}


def small_config(small_npz, run_dir=None, **overrides):
    """`support.small_config` for one epoch of an even smaller model: these tests check files, not learning."""
    values = {"model_overrides": SMALL_MODEL, "epochs": 1, "batch_size": 40}
    return support.small_config(small_npz, run_dir, **{**values, **overrides})


def users_folder(path):
    """The issue's case: a folder of the user's with a JSON-object config.json and a log."""
    (path / "logs").mkdir(parents=True)
    (path / "config.json").write_text('{"editor": "vim"}')
    (path / "logs" / "important.log").write_text("keep")
    return path


def a_preset(path):
    return save_to_preset(build_model("quadratic_tiny", **SMALL_MODEL), path)


def an_export_root(path):
    ExportRoot(path).claim()
    (path / "quadratic_tiny" / "1").mkdir(parents=True)
    return path


def a_symlink_to_a_users_folder(path):
    users_folder(path.with_name("target"))
    path.symlink_to(path.with_name("target"))
    return path


def some_of_a_runs_files(path):
    """What an earlier run left, or a copy of one, without the package's mark."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "history.csv").write_text("epoch,loss\n0,2.0\n")
    return path


@pytest.mark.parametrize(
    "make, holds",
    [
        (users_folder, r"files without keras_attnconv's mark \(config.json, logs\)"),
        (a_preset, "holds a preset directory"),
        (an_export_root, "holds an export root"),
        (a_symlink_to_a_users_folder, r"files without keras_attnconv's mark \(config.json, logs\)"),
        (some_of_a_runs_files, r"files without keras_attnconv's mark \(config.json, history.csv\)"),
    ],
)
def test_what_is_not_a_run_of_the_package_is_refused_by_name_and_left_as_it_is(
    small_npz, tmp_path, capsys, make, holds
):
    path = make(tmp_path / "proj")
    before, around = snapshot(path), snapshot(tmp_path)
    assert cli.main(tiny_train_command(small_npz, path)) == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1
    assert f"{path} holds" in error and re.search(holds, error), error
    assert f"run_dir='{path}'" in error
    assert snapshot(path) == before and snapshot(tmp_path) == around


def test_a_users_folder_given_in_python_is_a_foreign_directory_error(small_npz, tmp_path):
    path = users_folder(tmp_path / "proj")
    with pytest.raises(ForeignDirectoryError, match="never changed. Pass another run_dir"):
        train(small_config(small_npz, path))


def test_an_empty_folder_is_claimed_and_marked_as_a_run(small_npz, tmp_path):
    (tmp_path / "proj").mkdir()
    metrics = train(small_config(small_npz, tmp_path / "proj"))
    assert mark_of(tmp_path / "proj") == "run" and RunDirectory(metrics["run_dir"]).is_finished()


def test_numbered_runs_pass_over_a_users_folder_of_the_same_name(small_npz, tmp_path):
    runs = tmp_path / "runs"
    users_folder(runs / "small")
    before = snapshot(runs / "small")
    metrics = train(small_config(small_npz, runs_dir=str(runs)))
    assert metrics["run_dir"] == str(runs / "small-1")
    assert snapshot(runs / "small") == before


def test_only_the_records_of_an_unfinished_run_are_removed_when_it_starts_anew(small_npz, tmp_path):
    # A run of another configuration that never completed an epoch is started anew: its records go, and a
    # file the user put beside them stays.
    run = tmp_path / "run"
    write_mark(run, "run")
    (run / "config.json").write_text(json.dumps({**vars(small_config(small_npz, run)), "epochs": 9}))
    (run / "history.csv").write_text("epoch,loss\n0,9.0\n")
    (run / "notes.txt").write_text("mine")
    train(small_config(small_npz, run))
    assert (run / "notes.txt").read_text() == "mine"
    assert json.loads((run / "config.json").read_text())["epochs"] == 1


def a_copied_run_mark(path):
    """A run's mark, copied by hand into `path` (a folder of the user's, or a copy of another run)."""
    RunDirectory(path.with_name("a_real_run")).claim()
    shutil.copy(path.with_name("a_real_run") / MARKER, path / MARKER)
    return path


def a_users_folder_with_a_copied_run_mark(path):
    users_folder(path)
    (path / "notes.txt").write_text("mine")
    return a_copied_run_mark(path)


def records_without_a_config_beside_a_copied_run_mark(path):
    path.mkdir(parents=True)
    (path / "history.csv").write_text("epoch,loss\n0,2.0\n")  # the user's, which a new run would remove
    (path / "logs").mkdir()
    (path / "logs" / "important.log").write_text("keep")
    return a_copied_run_mark(path)


def a_copy_of_another_unfinished_run(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps({**vars(small_config("small.npz", path.with_name("elsewhere"))), "epochs": 9})
    )
    (path / "logs").mkdir()
    (path / "logs" / "important.log").write_text("keep")
    return a_copied_run_mark(path)


@pytest.mark.parametrize(
    "make, says",
    [
        (a_users_folder_with_a_copied_run_mark, "config.json names run_dir=None, not this folder"),
        (
            records_without_a_config_beside_a_copied_run_mark,
            "holds history.csv, logs beside a run's mark but no config.json",
        ),
        (a_copy_of_another_unfinished_run, "config.json names run_dir='{elsewhere}', not this folder"),
    ],
)
def test_a_mark_alone_licenses_no_change_to_what_is_beside_it(small_npz, tmp_path, capsys, make, says):
    # A run removes (starting anew) or rewrites only the records its own config.json says are this folder's;
    # where the folder and the run's records disagree, the command is refused by name and nothing changes.
    path = tmp_path / "proj"
    make(path)
    before = snapshot(path)
    assert cli.main(tiny_train_command(small_npz, path)) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and f"Received: run_dir='{path}'" in error, error
    assert f"{path}" in error and says.format(elsewhere=tmp_path / "elsewhere") in error, error
    assert snapshot(path) == before


def test_start_anew_refuses_a_run_with_a_completed_epoch_or_not_ours(tmp_path):
    with pytest.raises(ValueError, match="Only the records of an unfinished run"):
        RunDirectory(users_folder(tmp_path / "proj")).start_anew()
    run = RunDirectory(tmp_path / "run")
    run.claim()
    (run.backup_dir).mkdir()
    (run.backup_dir / "latest.json").write_text('{"epoch": 1}')
    with pytest.raises(ValueError, match="Only the records of an unfinished run"):
        run.start_anew()
    assert run.has_completed_epoch()


def test_a_directory_of_a_later_layout_is_not_touched(small_npz, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text(json.dumps({"package": "keras_attnconv", "kind": "run", "layout": 99}))
    with pytest.raises(ForeignDirectoryError, match="later keras_attnconv"):
        train(small_config(small_npz, run))
    assert [p.name for p in run.iterdir()] == [MARKER]


KILLED_RUN = """
from keras_attnconv.training import run_directory
from keras_attnconv.training import TrainConfig, train
{kill}
train(TrainConfig(**{config!r}))
"""


#: Kills the process just before `name` is renamed into place (its whole temporary written).
DIE_BEFORE_RENAMING = """
import os
real_replace = os.replace
def replace(source, target):
    if os.path.basename(target) == {name!r}:
        die()
    real_replace(source, target)
os.replace = replace
"""


def temporaries(path):
    return sorted(entry.name for entry in Path(path).iterdir() if ".tmp-" in entry.name)


@pytest.mark.parametrize(
    "kill",
    [
        "die_after(run_directory, 'write_mark')",  # marked, nothing else written
        "die_after(run_directory.RunDirectory, 'write_config')",  # its config written, no epoch
        "die_before(run_directory.RunDirectory, 'write_metrics')",  # trained and preset, not finished
        DIE_BEFORE_RENAMING.format(name="metrics.json"),  # finished but for the rename: its temporary left
    ],
)
def test_a_kill_at_any_step_of_a_runs_creation_or_completion_is_carried_on_by_the_same_command(
    small_npz, tmp_path, kill
):
    config = small_config(small_npz, tmp_path / "run")
    run_until_killed(KILLED_RUN.format(kill=kill, config=vars(config)))
    run = RunDirectory(tmp_path / "run")
    assert run.is_ours() and not run.is_finished()
    metrics = train(config)
    assert run.is_finished() and len(metrics["history"]["loss"]) == 1
    assert json.loads(run.config_file.read_text())["epochs"] == 1
    assert temporaries(run.path) == []  # what the killed writer left is gone


def test_the_temporaries_of_killed_writers_are_removed_by_the_next_write_and_nothing_else(tmp_path):
    # A kill just before export.json is renamed into place leaves its temporary; the next write of export.json
    # removes it, recognised by the name only the package makes and a pid that is no longer alive. A live
    # writer's temporary, a user's look-alike and a name without the random part stay.
    run = RunDirectory(tmp_path / "run")
    run.claim()
    run_until_killed(
        DIE_BEFORE_RENAMING.format(name="export.json") + "from keras_attnconv.training import "
        f"RunDirectory\nRunDirectory({str(run.path)!r}).record_export('saved_models/quadratic_tiny/1')"
    )
    killed = temporaries(run.path)
    assert len(killed) == 1 and re.fullmatch(r"\.export\.json\.tmp-[0-9a-f]{8}-.+-\d+\.json", killed[0])
    live = f".export.json.tmp-0a1b2c3d-{socket.gethostname()}-{os.getpid()}.json"
    kept = [live, ".export.json.tmp-my-copy.json", f".export.json.tmp-{int(killed[0].rsplit('-', 1)[1][:-5])}.json"]
    for name in kept:
        (run.path / name).write_text("kept")
    run.record_export("saved_models/quadratic_tiny/2")
    assert temporaries(run.path) == sorted(kept)
    assert json.loads(run.export_record.read_text()) == {"export": "saved_models/quadratic_tiny/2"}


def test_none_on_the_command_line_means_none(small_npz, tmp_path, monkeypatch, capsys):
    # --export-dir none: no export (the default root is not written); --seed none: no seed, recorded as such.
    monkeypatch.chdir(tmp_path)
    assert cli.main([*tiny_train_command(small_npz, tmp_path / "run"), "--seed", "None"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.index("{\n") :])  # after the epoch lines
    assert summary["export"] is None and not (tmp_path / "saved_models").exists()
    assert json.loads(RunDirectory(tmp_path / "run").config_file.read_text())["seed"] is None


def test_none_in_a_recipe_and_in_python_means_none(tmp_path):
    from keras_attnconv.training.recipe import load_recipe

    recipe = tmp_path / "r.toml"
    recipe.write_text('export_dir = "none"\ndata_dir = "NULL"\nseed = "none"\n')
    config = load_recipe(recipe)
    assert (config.export_dir, config.data_dir, config.seed) == (None, None, None)
    assert load_recipe(recipe, seed=3, export_dir=None).seed == 3
    assert load_recipe(recipe, steps_per_epoch=None).steps_per_epoch is None


#: The run directory's own names, which only its owner spells.
RUN_LAYOUT = (
    RunDirectory.METRICS,
    RunDirectory.HISTORY,
    RunDirectory.CENTERS,
    RunDirectory.EXPORT_RECORD,
    "best.keras",
    "best.json",
)


@pytest.mark.parametrize(
    "owner, names",
    [
        ("training/run_directory.py", RUN_LAYOUT),
        ("export/root.py", ("models.config", "saved_models", "onnx_models", "litert_models")),
    ],
)
def test_each_layout_is_spelled_by_its_owner_alone(owner, names):
    package = Path(__file__).parents[2] / "keras_attnconv"
    spelled = {}
    for module in package.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                spelled.setdefault(str(module.relative_to(package)), set()).add(node.value)
    assert set(spelled) == {owner}, spelled


def test_a_read_only_folder_is_refused_before_any_work(small_npz, tmp_path, monkeypatch):
    run = tmp_path / "readonly"
    run.mkdir()
    run.chmod(0o555)
    try:
        real_access = os.access  # root ignores file modes: answer as os.access would for another user
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != run and real_access(path, mode))
        with pytest.raises(PermissionError, match=f"Cannot write to run_dir='{run}': {run} is not writable"):
            train(small_config(small_npz, run))
        assert list(run.iterdir()) == []
    finally:
        run.chmod(0o755)


@pytest.mark.parametrize(
    "content, holds",
    [
        ("[1, 2]", "holds a JSON list, not an object"),
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "cannot be read .JSON nested too deeply"),
    ],
)
def test_a_run_config_that_is_not_a_recipe_is_named(tmp_path, content, holds):
    run = RunDirectory(tmp_path / "run")
    run.claim()
    run.config_file.write_text(content)
    with pytest.raises(ValueError, match=f"{holds}.*Received: run_dir='{run.path}'"):
        run.read_config()
