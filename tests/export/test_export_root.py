"""The export root's owner: exports go only into an export root of the package's or a TF Serving root of the
user's; versions and names are checked before any work; models.config is merged (what the package did not write
stays as it was) and replaced atomically; a kill at any moment of a publication leaves a root the next export
works in."""

import json
import os
import time
from pathlib import Path

import pytest
from support import requires_tensorflow, run_until_killed, served_config, snapshot, tiny_model

from keras_attnconv import build_model, cli, export, save_to_preset
from keras_attnconv.export.root import MAX_VERSION, ExportRoot
from keras_attnconv.training.run_directory import RunDirectory
from keras_attnconv.utils.ownership import mark_of

pytestmark = requires_tensorflow


def parsed(path):
    """models.config as TF Serving's message."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    return text_format.Parse(path.read_text(), model_server_config_pb2.ModelServerConfig())


def a_run(path):
    RunDirectory(path).claim()
    (path / "metrics.json").write_text("{}")
    return path


def a_preset(path):
    return save_to_preset(build_model("quadratic_tiny", num_layers=1, hidden_dim=8, intermediate_dim=8), path)


def a_users_folder(path):
    (path / "photos").mkdir(parents=True)
    (path / "notes.txt").write_text("mine")
    return path


def a_photo_folder(path):
    """Folders named like TF Serving's model and version directories (2023/01/), holding no model."""
    (path / "2023" / "01").mkdir(parents=True)
    (path / "2023" / "01" / "beach.jpg").write_bytes(b"\xff\xd8\xff\xe0 a photo")
    return path


def a_photo_folder_with_a_models_config(path):
    a_photo_folder(path)
    (path / "models.config").write_text("model_config_list {}\n")
    return path


@pytest.mark.parametrize(
    "make, holds",
    [
        (a_run, "holds a training run directory"),
        (a_preset, "holds a preset directory"),
        (a_users_folder, r"holds files without keras_attnconv's mark \(notes.txt, photos\)"),
        (a_photo_folder, r"holds files without keras_attnconv's mark \(2023\)"),
        (a_photo_folder_with_a_models_config, r"holds files without keras_attnconv's mark \(2023, models.config\)"),
    ],
)
def test_what_is_not_an_export_root_is_refused_by_name_before_any_work(tmp_path, make, holds):
    root = make(tmp_path / "root")
    before = snapshot(root)
    with pytest.raises(FileExistsError, match=f"{root} {holds}.*Pass another export_dir"):
        export.export_model(tiny_model(), root, warmup=False)
    assert snapshot(root) == before


def test_a_tf_serving_root_of_the_users_is_added_to_and_nothing_of_it_changed(tmp_path):
    root = tmp_path / "serving"
    (root / "theirs" / "7").mkdir(parents=True)
    (root / "theirs" / "7" / "saved_model.pb").write_bytes(b"their model")
    before = snapshot(root)
    path = export.export_model(tiny_model(), root, warmup=False)
    after = snapshot(root)
    assert {name: value for name, value in after.items() if name in before} == before
    assert path == root / "tiny" / "1" and mark_of(root) == "export_root"
    assert list(served_config(root)) == ["tiny"]  # their model is not served unless they list it


@pytest.mark.parametrize("version", [MAX_VERSION + 1, 0, -1, True, "3"])
def test_a_version_outside_tf_servings_range_is_refused_before_any_work(tmp_path, version):
    with pytest.raises(ValueError, match=f"version.*2\\*\\*63 - 1.*Received: version={version!r}"):
        export.export_model(tiny_model(), tmp_path / "root", version=version)
    assert not (tmp_path / "root").exists()


def test_the_cli_refuses_a_version_past_int64_and_later_exports_still_work(tmp_path, capsys):
    preset = a_preset(tmp_path / "preset")
    root = tmp_path / "sm"
    assert cli.main(["export", str(preset), "--export-dir", str(root), "--version", str(MAX_VERSION + 1)]) == 2
    assert "Received: version=9223372036854775808" in capsys.readouterr().err and not root.exists()
    assert cli.main(["export", str(preset), "--export-dir", str(root), "--version", str(MAX_VERSION)]) == 0
    # The next free version would be past int64: refused before the work, the root as it was.
    before = snapshot(root)
    assert cli.main(["export", str(preset), "--export-dir", str(root)]) == 2
    assert "Received: version=9223372036854775808" in capsys.readouterr().err and snapshot(root) == before
    assert cli.main(["export", str(preset), "--export-dir", str(root), "--version", "2"]) == 0
    assert served_config(root)["quadratic_tiny"][2] == [MAX_VERSION]


def test_a_name_that_is_the_roots_own_file_is_refused_and_export_and_serve_still_work(tmp_path, capsys):
    preset = a_preset(tmp_path / "preset")
    root = tmp_path / "sm"
    assert cli.main(["export", str(preset), "--export-dir", str(root), "--name", "models.config"]) == 2
    assert "cannot be 'models.config'" in capsys.readouterr().err and not root.exists()
    assert cli.main(["export", str(preset), "--export-dir", str(root)]) == 0
    assert cli.main(["export", str(preset), "--export-dir", str(root)]) == 0
    assert cli.main(["serve", "quadratic_tiny", "2", "--export-dir", str(root)]) == 0
    assert served_config(root)["quadratic_tiny"][2] == [2]


def test_a_models_config_that_is_a_directory_is_named_before_any_work(tmp_path):
    (tmp_path / "root" / "models.config" / "1").mkdir(parents=True)
    before = snapshot(tmp_path / "root")
    with pytest.raises(ValueError, match="models.config is not a TF Serving model config"):
        export.export_model(tiny_model(), tmp_path / "root", warmup=False)
    assert snapshot(tmp_path / "root") == before


USERS_CONFIG = """
model_config_list {
  config {
    name: "theirs"
    base_path: "/elsewhere/theirs"
    model_platform: "tensorflow"
    model_version_policy { latest { num_versions: 2 } }
  }
  config {
    name: "tiny"
    base_path: "/models/tiny"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 2 }
  }
}
"""


def test_models_config_is_merged_keeping_what_the_package_did_not_write(tmp_path):
    root = tmp_path / "root"
    for seed in range(2):
        export.export_model(tiny_model(seed=seed), root, warmup=False)
    (root / "models.config").write_text(USERS_CONFIG)
    users = parsed(root / "models.config")
    export.export_model(tiny_model(seed=2), root, warmup=False)  # a new version of tiny
    export.export_model(tiny_model(name="other"), root, warmup=False)  # a new model
    merged = parsed(root / "models.config")
    assert list(merged.model_config_list.config)[:2] == list(users.model_config_list.config)
    assert served_config(root)["other"] == ("/models/other", "tensorflow", [1])
    # --serve changes the served versions of that model, and nothing else of its entry or of the file. Its labels
    # are the user's: TF Serving refuses one on a version it does not serve, so the user moves them first.
    with pytest.raises(ValueError, match="label 'canary' on version 2.*Received: name='tiny', version=3"):
        export.set_served_version(root, "tiny", 3)
    from google.protobuf import text_format

    moved = parsed(root / "models.config")
    moved.model_config_list.config[1].version_labels.update({"stable": 3, "canary": 3})
    (root / "models.config").write_text(text_format.MessageToString(moved))
    export.set_served_version(root, "tiny", 3)
    tiny = {entry.name: entry for entry in parsed(root / "models.config").model_config_list.config}["tiny"]
    assert list(tiny.model_version_policy.specific.versions) == [3]
    assert dict(tiny.version_labels) == {"stable": 3, "canary": 3} and tiny.base_path == "/models/tiny"
    assert parsed(root / "models.config").model_config_list.config[0] == users.model_config_list.config[0]


def test_a_model_new_to_models_config_serves_its_first_version_not_its_newest(tmp_path):
    root = tmp_path / "root"
    for seed in range(3):
        export.export_model(tiny_model(seed=seed), root, warmup=False)
    (root / "models.config").write_text('model_config_list { config { name: "theirs" base_path: "/x" } }')
    export.export_model(tiny_model(name="other"), root, warmup=False)
    assert served_config(root)["tiny"][2] == [1]


def test_a_half_published_version_is_never_served_and_the_next_export_passes_it(tmp_path, capsys):
    root = tmp_path / "root"
    export.export_model(tiny_model(), root, warmup=False)
    (root / "tiny" / "2").mkdir()  # a copy in progress, or what another tool left
    (root / "tiny" / "2" / "variables").mkdir()
    assert export.export_model(tiny_model(), root, warmup=False) == root / "tiny" / "3"
    assert cli.main(["serve", "tiny", "2", "--export-dir", str(root)]) == 2
    assert "tiny/2 holds no SavedModel to serve" in capsys.readouterr().err
    assert served_config(root)["tiny"][2] == [1]


KILLED_EXPORT = """
from support import tiny_model
from keras_attnconv import export
from keras_attnconv.export import root as export_root
export.export_model(tiny_model(), {root!r}, warmup=False)
{kill}
export.export_model(tiny_model(seed=1), {root!r}, warmup=False)
"""

#: Where an export dies: just after its version was renamed into place; inside the replacement of
#: models.config, its new text written but not renamed onto the old one.
EXPORT_KILLS = {
    "after publishing the version": "die_before(export_root.ExportRoot, 'update_models_config')",
    "before models.config is replaced": """
real_replace = os.replace
def replace(source, target):
    if str(target).endswith('models.config'):
        die()
    real_replace(source, target)
os.replace = replace
""",
}


@pytest.mark.parametrize("kill", EXPORT_KILLS.values(), ids=EXPORT_KILLS.keys())
def test_a_kill_while_publishing_leaves_the_old_or_new_state_and_the_next_export_works(tmp_path, kill, monkeypatch):
    root = tmp_path / "root"
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))  # the script's `support`
    run_until_killed(KILLED_EXPORT.format(root=str(root), kill=kill))
    assert served_config(root)["tiny"][2] == [1]  # the first export's models.config, whole
    assert export.export_model(tiny_model(seed=2), root, warmup=False) == root / "tiny" / "3"
    assert served_config(root)["tiny"][2] == [1]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".models.config.tmp")) == []
    assert sorted(p.name for p in (root / "tiny").iterdir()) == ["1", "2", "3"]
    assert json.loads((root / "tiny" / "2" / "assets.extra" / "metadata.json").read_text())["version"] == 2


def test_a_directory_named_with_a_non_ascii_digit_is_not_a_version(tmp_path):
    export.export_model(tiny_model(), tmp_path, warmup=False)
    (tmp_path / "tiny" / "\u00b2").mkdir()  # '²'.isdigit() is True, int('²') fails
    assert export.export_model(tiny_model(), tmp_path, warmup=False) == tmp_path / "tiny" / "2"
    assert ExportRoot(tmp_path).versions("tiny") == [1, 2]


def test_serving_a_misspelled_model_suggests_the_closest_one(tmp_path, capsys):
    export.export_model(tiny_model("quadratic_tiny"), tmp_path, warmup=False)
    assert cli.main(["serve", "quadratic_tyni", "1", "--export-dir", str(tmp_path)]) == 2
    assert "holds no SavedModel to serve. Did you mean 'quadratic_tiny'?" in capsys.readouterr().err


def a_finished_run(path):
    """A finished run of the package, as `attnconv train` leaves it: its mark, its best model as a preset, metrics."""
    RunDirectory(path).claim()
    a_preset(path / "preset")
    (path / "metrics.json").write_text("{}")
    return path


def days_old(path, days):
    os.utime(path, (time.time() - days * 24 * 3600,) * 2, follow_symlinks=False)
    return path


def test_a_users_hidden_files_in_a_tf_serving_root_are_never_taken_for_a_killed_writers_whatever_their_age(
    tmp_path, capsys
):
    # The cleanup of killed exports recognises its staging by the name only the package makes (a random part,
    # the host and a pid); a name it cannot parse is the user's, however old.
    tfs = tmp_path / "tfs"
    (tfs / "quadratic_tiny" / "1").mkdir(parents=True)
    (tfs / "quadratic_tiny" / "1" / "saved_model.pb").write_bytes(b"their model")
    mine = [tfs / "quadratic_tiny" / ".tmp-my-notes", tfs / ".models.config.tmp-backup"]
    for path in mine:
        path.write_text("mine")
        days_old(path, 3)
    assert cli.main(["export", str(a_finished_run(tmp_path / "run")), "--export-dir", str(tfs)]) == 0, (
        capsys.readouterr().err
    )
    assert (tfs / "quadratic_tiny" / "2" / "saved_model.pb").exists()
    assert [path.read_text() for path in mine] == ["mine", "mine"]


LABELLED = """
model_config_list {
  config {
    name: "tiny"
    base_path: "/models/tiny"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 } }
    version_labels { key: "stable" value: 1 }
  }
}
"""


def test_serving_a_version_that_would_leave_a_users_label_unserved_is_refused_naming_it(tmp_path, capsys):
    # TF Serving refuses a version label on a version it does not serve: `serve tiny 2` would break the file.
    root = tmp_path / "root"
    for seed in range(2):
        export.export_model(tiny_model(seed=seed), root, warmup=False)
    (root / "models.config").write_text(LABELLED)
    before = snapshot(root)
    assert cli.main(["serve", "tiny", "2", "--export-dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "label 'stable' on version 1" in err and "Received: name='tiny', version=2" in err
    with pytest.raises(ValueError, match="label 'stable' on version 1.*Received: name='tiny'"):
        export.export_model(tiny_model(seed=2), root, serve=True, warmup=False)  # before any work
    assert snapshot(root) == before
    assert cli.main(["serve", "tiny", "1", "--export-dir", str(root)]) == 0  # the labelled version itself
    tiny = parsed(root / "models.config").model_config_list.config[0]
    assert list(tiny.model_version_policy.specific.versions) == [1] and dict(tiny.version_labels) == {"stable": 1}


ELSEWHERE = """
model_config_list {
  config {
    name: "tiny"
    base_path: "/elsewhere/tiny"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 7 } }
  }
}
"""


def test_an_entry_serving_a_model_from_another_folder_is_the_users_and_never_changed(tmp_path, capsys):
    root = tmp_path / "root"
    export.export_model(tiny_model(), root, warmup=False)
    (root / "models.config").write_text(ELSEWHERE)
    theirs = parsed(root / "models.config").model_config_list.config[0]
    export.export_model(tiny_model(name="other"), root, warmup=False)
    assert parsed(root / "models.config").model_config_list.config[0] == theirs  # still version 7, from elsewhere
    assert served_config(root)["other"] == ("/models/other", "tensorflow", [1])
    # What would need that entry is refused, naming it, before any work.
    before = snapshot(root)
    with pytest.raises(
        ValueError, match="entry 'tiny' serves /elsewhere/tiny, not /models/tiny.*Received: name='tiny'"
    ):
        export.export_model(tiny_model(seed=1), root, warmup=False)
    assert cli.main(["serve", "tiny", "1", "--export-dir", str(root)]) == 2
    assert "entry 'tiny' serves /elsewhere/tiny" in capsys.readouterr().err
    assert snapshot(root) == before


def test_a_models_config_that_is_a_link_is_written_through_it(tmp_path):
    root, target = tmp_path / "root", tmp_path / "serving" / "models.config"
    export.export_model(tiny_model(), root, warmup=False)
    target.parent.mkdir()
    (root / "models.config").rename(target)
    (root / "models.config").symlink_to(target)  # the file TF Serving reads is the target
    export.export_model(tiny_model(name="other"), root, warmup=False)
    export.set_served_version(root, "tiny", 1)
    assert (root / "models.config").is_symlink() and (root / "models.config").readlink() == target
    assert {name: versions for name, (_, _, versions) in served_config(target.parent).items()} == {
        "tiny": [1],
        "other": [1],
    }
    assert sorted(p.name for p in target.parent.iterdir()) == ["models.config"]  # no temporary file left


COMMENTED = """# The lab's TF Serving models (ana@lab).
# Keep this header.

model_config_list {
  config {
    name: "theirs"
    base_path: "/srv/#archive/theirs"
    model_platform: "tensorflow"
  }
  config {
    name: "tiny"  # the first model
    base_path: "/models/tiny"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 } }
  }
}
"""


def test_models_config_keeps_its_leading_comments_and_says_once_which_others_go(tmp_path):
    import warnings

    root = tmp_path / "root"
    export.export_model(tiny_model(), root, warmup=False)
    (root / "models.config").write_text(COMMENTED)
    with pytest.warns(UserWarning, match=f"{root / 'models.config'}: its comment on line 11 is not kept"):
        export.export_model(tiny_model(name="other"), root, warmup=False)
    text = (root / "models.config").read_text()
    assert text.startswith("# The lab's TF Serving models (ana@lab).\n# Keep this header.\n\n")
    assert "the first model" not in text and set(served_config(root)) == {"theirs", "tiny", "other"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: nothing more goes
        export.export_model(tiny_model(name="third"), root, warmup=False)
    assert (root / "models.config").read_text().startswith("# The lab's TF Serving models (ana@lab).\n")


@pytest.mark.parametrize(
    "change",
    [{"num_classes": 4}, {"class_names": ["owl", "cat", "dog"]}, {"image_size": 16}],
    ids=["more classes", "other class names", "another input"],
)
def test_a_version_of_other_classes_or_input_is_refused_under_the_name_before_any_work(tmp_path, change):
    root = tmp_path / "root"
    export.export_model(tiny_model(), root, warmup=False)
    before = snapshot(root)
    other = tiny_model().with_config(**change)
    with pytest.raises(ValueError, match=r"root/tiny holds version 1, whose .* are not this model's .*--name"):
        export.export_model(other, root, warmup=False)
    assert snapshot(root) == before
    assert export.export_model(other, root, serving_name="tiny_v2", warmup=False) == root / "tiny_v2" / "1"


def test_the_same_classes_and_input_with_another_normalization_are_a_new_version(tmp_path):
    root = tmp_path / "root"
    export.export_model(tiny_model(), root, warmup=False)
    other = tiny_model().with_config(pixel_mean=(0.5, 0.5, 0.5))  # inside the exported graph: no client sees it
    assert export.export_model(other, root, warmup=False) == root / "tiny" / "2"


def test_a_version_that_records_no_preprocessing_is_not_compared(tmp_path):
    root = tmp_path / "root"
    (root / "tiny" / "7").mkdir(parents=True)
    (root / "tiny" / "7" / "saved_model.pb").write_bytes(b"their model")  # TF Serving's, not the package's
    assert export.export_model(tiny_model(), root, warmup=False) == root / "tiny" / "8"
