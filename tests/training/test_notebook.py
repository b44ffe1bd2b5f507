"""The quickstart notebook runs from top to bottom and learns."""

import json
from pathlib import Path

import matplotlib

NOTEBOOK = Path(__file__).parents[2] / "training" / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_executes(monkeypatch):
    matplotlib.use("Agg")
    monkeypatch.setenv("QUICKSTART_EPOCHS", "1")
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    namespace = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{NOTEBOOK.name}", "exec"), namespace)
    assert set(namespace["history"].history) >= {"loss", "val_loss", "accuracy", "val_accuracy"}
    assert namespace["accuracy"] > 0.12  # above chance after one epoch on real images
    assert [axis.get_title() for axis in namespace["figure"].axes] == ["loss", "accuracy"]  # fit logs no rate
    assert [len(epochs) for epochs in namespace["centers"].history.values()] == [2, 2]  # the start and one epoch


def test_every_cell_has_its_own_id():
    # nbformat 4.5 requires one (and warns on every read without it).
    notebook = json.loads(NOTEBOOK.read_text())
    ids = [cell.get("id") for cell in notebook["cells"]]
    assert (notebook["nbformat"], notebook["nbformat_minor"]) >= (4, 5)
    assert all(ids) and len(set(ids)) == len(ids)
