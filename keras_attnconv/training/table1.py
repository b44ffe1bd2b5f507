"""Table 1 reproduced: training runs beside the paper's CIFAR-10 test accuracy, as a results file and its table.

`table1_report` reads run directories (finished or stopped: a stopped run
gives the epochs it completed, such as the first epochs of the paper's
300-epoch schedule) and returns what ``attnconv table1 RUN ... --output
training/results/table1-<gpu>.json`` writes: per run, the recipe, the
device, the per-epoch history, the minutes of training and the test
accuracy with its standard error beside Table 1's figure; the data by name
and digest; the runs that shared their device, whose minutes are not a run's
alone; what is not measured yet, said so.
"""

import dataclasses
import json
from pathlib import Path

from keras_attnconv.analysis.charts import accuracy_standard_error
from keras_attnconv.models import get_paper_figures, list_models
from keras_attnconv.training.callbacks import csv_history
from keras_attnconv.training.recipe import load_recipe, recipe_names
from keras_attnconv.training.run_directory import RunDirectory
from keras_attnconv.utils.checks import check_path
from keras_attnconv.utils.files import file_digest
from keras_attnconv.utils.reports import device_text, percent

#: The rows of the paper's Table 1, by the registered names of their models.
TABLE1_MODELS = ("resnet18", "quadratic", "learned", "learned_content")
#: Fields of a run's config that say where it ran, not what it trained.
_PLACES = ("runs_dir", "run_dir", "export_dir", "export_name", "data_dir", "verbose", "dataset")
#: The versions a run records (`keras_attnconv.utils.reports.device_description`) that the results name.
_LIBRARIES = ("keras", "jax", "tensorflow", "numpy")


def changes_from_recipe(config):
    """The settings in which a run's `config` differs from the package recipe it is named after, or None.

    None where the run's name is no recipe of the package (a run named by its
    user); ``{}`` where it trained the recipe as it is. A recipe changed on the
    command line (``--epochs 20``, ``--label-smoothing 0.1``) is thus never
    shown as the recipe itself. Where it ran (`_PLACES`) is no change.
    """
    if config["name"] not in recipe_names():
        return None
    recipe = dataclasses.asdict(load_recipe(config["name"]))
    compared = [k for k in sorted(config) if k in recipe and k not in (*_PLACES, "name")]
    return {k: config[k] for k in compared if config[k] != recipe[k]}


def changes_label(changes):
    """Changed settings as the tables show them: ``ema_momentum 0.999, label_smoothing 0.1``; a digest
    (``init_from_digest``) by its first 12 hexadecimal digits, which tell presets apart as well in a table."""

    def shown(value):
        if isinstance(value, str) and value.startswith("sha256:") and len(value) > len("sha256:") + 12:
            return json.dumps(value[: len("sha256:") + 12] + "...")
        return json.dumps(value)

    return ", ".join(f"{k} {shown(v)}" for k, v in changes.items())


def _recipe_label(record):
    """The run's recipe as the tables show it: its name, and what the run changed of it."""
    changed = changes_label(record.get("changes") or {})
    return f"`{record['recipe']}`" + (f" (changed: {changed})" if changed else "")


def run_record(path, device=None):
    """What the results file holds of the run directory at `path`.

    Its recipe and settings, its history, and, for a finished run, its test
    accuracy (the last epoch's weights on the evaluation split) with the
    standard error, the best epoch, and the minutes the training took
    (compilation and the evaluations included). `device` names the device
    where the run did not record it.
    """
    run = RunDirectory(check_path("run", path))
    config = run.read_config() if run.is_ours() else None
    if config is None:
        raise ValueError(
            f"{str(path)!r} is not a training run of the package (no run mark and config.json). "
            f"Received: run={str(path)!r}"
        )
    metrics = json.loads(run.metrics_file.read_text()) if run.metrics_file.exists() else None
    history = metrics["history"] if metrics else csv_history(run.history)
    machine = (metrics or {}).get("machine", {})
    if not (machine.get("device") or device):
        raise ValueError(
            f"{run} does not record its device (a run stopped early, or trained before runs "
            f"recorded it): name it. Received: device={device!r}"
        )
    record = {
        "recipe": config["name"],
        "model": config["model"],
        "device": machine.get("device") or device,
        "machine": device_text(machine) if machine.get("device") else None,  # a CPU's model and bfloat16 units
        "libraries": ", ".join(f"{name} {machine[name]}" for name in _LIBRARIES if name in machine) or None,
        "commit": (metrics or {}).get("package", {}).get("commit"),
        "settings": {k: v for k, v in sorted(config.items()) if k not in _PLACES},
        "changes": changes_from_recipe(config),
        "epochs": config["epochs"],
        "epochs_completed": len(history.get("val_accuracy", [])),
        "finished": metrics is not None,
        # A fine-tuned model need not be registered (a pruned one: `<name>_pruned`): no paper row then.
        "paper_accuracy": get_paper_figures(config["model"]).accuracy if config["model"] in list_models() else None,
        "history": history,
        "epoch_seconds": (
            json.loads(run.epoch_seconds.read_text())["epoch_seconds"] if run.epoch_seconds.exists() else []
        ),
    }
    if metrics:
        accuracy, examples = metrics["eval_accuracy"], metrics["eval_examples"]
        best = json.loads(run.best_record.read_text()) if run.best_record.exists() else {}
        record.update(
            test_accuracy=accuracy,
            test_examples=examples,
            standard_error=accuracy_standard_error(accuracy, examples),
            training_minutes=metrics["wall_seconds_this_session"] / 60,
            best_epoch=best.get("epoch"),
            best_test_accuracy=best.get("val_accuracy"),
            precision=metrics["precision"],
            step_path=metrics["step_path"],
            # The last weights without and with test-time flips (runs recorded before it: None).
            test_time_flips=metrics.get("eval_accuracy_by_test_time_flips"),
        )
    return record


def table1_report(
    runs,
    *,
    data_name,
    data_file,
    commit=None,
    libraries=None,
    device=None,
    command=None,
    earlier=None,
    side_by_side=False,
):
    """The Table 1 results of `runs` (run directories), as ``attnconv table1`` writes them.

    Args:
        runs: run directories: finished runs are Table 1's rows; stopped ones
            are kept as the first epochs of their schedule.
        data_name: what the data is ("CIFAR-10 (JPEG copy)").
        data_file: the file the data came from, whose digest is recorded.
        commit: the package's commit the runs trained with, for runs that did not record it.
        libraries: the libraries' versions ("jax 0.11.2, keras 3.15.1"), for runs that did not record them.
        device: the device, for runs that did not record it.
        command: the command line that made the report.
        earlier: a report made before (the results file, read), whose runs
            stay unless a run of the same recipe replaces them: the runs of
            several sessions, each on its own GPU lease, make one table. Its
            data must be the same.
        side_by_side: whether `runs` trained at the same time on one device.
            Each then records the recipes it shared the device with
            (``trained_beside``), and the tables say so beside its minutes.
    """
    digest = file_digest(data_file, "data_file")
    records = [run_record(path, device) for path in runs]
    for path, record in zip(runs, records):  # its table has no row for it: it would be listed, and shown nowhere
        if record["model"] not in TABLE1_MODELS:
            raise ValueError(
                f"{str(path)!r} trains {record['model']}, which is not a model of Table 1 "
                f"({', '.join(TABLE1_MODELS)}): `attnconv compare` tabulates other models. Received: run={str(path)!r}"
            )
    for record in records:
        beside = [other["recipe"] for other in records if other is not record] if side_by_side else []
        record["trained_beside"] = beside
        record["libraries"] = record["libraries"] or libraries
        record["commit"] = commit or record["commit"]
        if record["commit"] is None:
            raise ValueError(
                f"The run of {record['recipe']} does not record the package's commit (trained from an "
                f"installed package, or before runs recorded it): name it. Received: commit=None"
            )
    if earlier is not None:
        if earlier["data"]["digest"] != digest:
            raise ValueError(
                f"The earlier results were measured on other data ({earlier['data']['digest']}): "
                f"they cannot share a table. Received: data_file={str(data_file)!r} ({digest})"
            )
        replaced = {r["recipe"] for r in records}
        records = [r for r in earlier["runs"] if r["recipe"] not in replaced] + records
    finished = [r for r in records if r["finished"]]
    doubled = sorted({r["model"] for r in finished if sum(o["model"] == r["model"] for o in finished) > 1})
    if doubled:
        raise ValueError(
            f"Two finished runs train {', '.join(doubled)}: which one is its row is unclear. "
            f"Received: runs={[str(path) for path in runs]}"
        )
    return {
        "commands": [*(earlier or {}).get("commands", []), command],
        "data": {"name": data_name, "file": Path(data_file).name, "digest": digest},
        "runs": records,
        "not_measured": [m for m in TABLE1_MODELS if m not in {r["model"] for r in finished}],
    }


def _flips_gain(run):
    """What test-time flips gain on the run's last weights, where the run measured it."""
    flips = run.get("test_time_flips")
    if not flips:
        return ""
    return (
        f"; test-time flips {percent(flips['without'], 2)} -> {percent(flips['with'], 2)} "
        f"({100 * flips['gain']:+.2f} ± {100 * flips['gain_standard_error']:.2f} points)"
    )


def _minutes(run):
    """The run's minutes of training, and the runs it shared its device with, whose work they include."""
    beside = ", ".join(f"`{recipe}`" for recipe in run.get("trained_beside", []))
    return f"{run['training_minutes']:.1f}" + (f" (beside {beside})" if beside else "")


def table1_rows(report):
    """The front page's rows: per Table 1 model, the paper's accuracy and this package's (or why not)."""
    finished = {r["model"]: r for r in report["runs"] if r["finished"]}
    rows = []
    for model in TABLE1_MODELS:
        paper = get_paper_figures(model).accuracy
        run = finished.get(model)
        if run is None:
            rows.append([f"`{model}`", percent(paper), "not trained yet", "-", "-", "-", "-", "-"])
            continue
        rows.append(
            [
                f"`{model}`",
                percent(paper),
                f"{percent(run['test_accuracy'], 2)} ± {percent(run['standard_error'], 2)}",
                f"{100 * (run['test_accuracy'] - paper):+.1f}",
                _recipe_label(run),
                f"{run['epochs']}",
                _minutes(run),
                run["device"],
            ]
        )
    return rows


TABLE1_HEADER = (
    "| model | Table 1 (300 epochs) | this package (test, ± s.e.) | points | recipe | epochs | minutes | device |"
)


def table1_markdown(report):
    """The report as markdown: Table 1 beside the paper, then the stopped runs' first epochs."""
    made = "; then ".join(f"`{command}`" for command in report["commands"])
    lines = [
        f"# Table 1 on {report['data']['name']}",
        "",
        f"Made by {made}; data `{report['data']['file']}` ({report['data']['digest']}).",
        "",
        TABLE1_HEADER,
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table1_rows(report)]
    examples = sorted({f"{r['test_examples']:,}" for r in report["runs"] if r["finished"]})
    shared = any(run.get("trained_beside") for run in report["runs"])
    lines += [
        "",
        f"Test accuracy: the last epoch's weights on the {' or '.join(examples) or 'held-out'} test images; "
        "points: this package's minus the paper's; minutes: the training command's fit and evaluations, "
        "compilation included"
        + ("; beside: trained at the same time on the same device, so slower than alone." if shared else "."),
        "",
        "Each run, where it ran:",
        "",
    ]
    lines += [
        f"- {_recipe_label(run)}: package commit {run['commit']}, {run['device']}, "
        f"{run['libraries'] or 'libraries not recorded'}{_flips_gain(run)}"
        for run in report["runs"]
    ]
    stopped = [r for r in report["runs"] if not r["finished"]]
    if stopped:
        lines += ["", "Stopped runs (the first epochs of their schedule), test accuracy after each 5th epoch:", ""]
        for run in stopped:
            accuracy = run["history"].get("val_accuracy", [])
            marks = ", ".join(f"{e}: {percent(accuracy[e - 1])}" for e in range(5, len(accuracy) + 1, 5))
            lines.append(f"- `{run['recipe']}` ({run['epochs']} epochs), {run['epochs_completed']} completed: {marks}")
    if report["not_measured"]:
        lines += ["", f"Not measured yet: {', '.join(report['not_measured'])}."]
    return "\n".join(lines) + "\n"
