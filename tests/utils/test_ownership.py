"""The package's mark (`.keras_attnconv.json`): what a valid one is, and that any other is named, never replaced."""

import json

import pytest
from support import snapshot

from keras_attnconv import build_model, save_to_preset
from keras_attnconv.training.run_directory import RunDirectory
from keras_attnconv.utils.ownership import MARKER, ForeignDirectoryError, mark_of, write_mark

VALID = {"package": "keras_attnconv", "kind": "run", "layout": 1}


def test_the_mark_the_package_writes_is_valid(tmp_path):
    write_mark(tmp_path / "run", "run")
    assert json.loads((tmp_path / "run" / MARKER).read_text()) == VALID and mark_of(tmp_path / "run") == "run"


@pytest.mark.parametrize(
    "text, received",
    [
        (json.dumps({**VALID, "layout": 1.0}), "layout=1.0"),  # a float, not the int 1: not "a later keras_attnconv"
        (json.dumps({**VALID, "layout": True}), "layout=True"),
        (json.dumps({**VALID, "layout": "1"}), "layout='1'"),
        (json.dumps({**VALID, "layout": 0}), "layout=0"),
        (json.dumps({**VALID, "kind": ["run"]}), "kind=['run']"),  # was a TypeError (a list is unhashable)
        (json.dumps({**VALID, "kind": "album"}), "kind='album'"),
        (json.dumps({**VALID, "package": "photos"}), "package='photos'"),
        (json.dumps([VALID]), "mark=[{"),
        ('{"package": ', "text='{\"package\": '"),
    ],
)
def test_a_mark_that_is_not_valid_is_named_with_what_it_holds_and_its_directory_never_changed(tmp_path, text, received):
    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text(text)
    before = snapshot(tmp_path)
    with pytest.raises(ForeignDirectoryError) as raised:
        RunDirectory(run).claim()
    message = str(raised.value)
    assert message.startswith(f"{run / MARKER} is not a valid mark of keras_attnconv")
    assert f"Received: {received}" in message and "\n" not in message
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "write",
    [
        lambda path: RunDirectory(path).claim(),
        lambda path: write_mark(path, "figures"),
        lambda path: save_to_preset(build_model("resnet_tiny"), path),
    ],
)
def test_a_folder_named_like_the_mark_is_named_not_replaced_through_a_hidden_temporary(tmp_path, write):
    directory = tmp_path / "mine"
    (directory / MARKER).mkdir(parents=True)
    (directory / MARKER / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(ForeignDirectoryError) as raised:
        write(directory)
    assert str(raised.value).startswith(f"{directory / MARKER} is not a valid mark of keras_attnconv (not a file)")
    assert str(raised.value).endswith("Received: a directory") and ".tmp-" not in str(raised.value)
    assert snapshot(tmp_path) == before


def test_a_mark_being_written_by_another_process_leaves_the_directory_free(tmp_path):
    # Two exports into one new root at once: the second saw the first's hidden temporary of the mark (named by
    # `write_json`) as a user's file, and refused the root (CI, 1 run in about 10).
    from keras_attnconv.utils.ownership import check_owned, visible_entries
    from keras_attnconv.utils.staging import temporary_name

    (tmp_path / temporary_name(f"{MARKER}.", ".json")).write_text("{")
    assert visible_entries(tmp_path) == []
    assert check_owned(tmp_path, "export_root", "export_dir") is False  # free: nothing of anyone's there yet
