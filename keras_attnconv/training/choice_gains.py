"""The gain of training choices: runs that changed settings of a base run, each beside it, as a results file.

``attnconv choices RUN ... --base BASE --output training/results/choices-<device>.json``
reads finished run directories that trained the base run's model with some of
its settings changed (``--cutout 16``, ``--label-smoothing 0.1``, a seed) and
records, per run, what it changed, its test accuracy and its gain over the
base in points, each with its standard error. The base is a run directory, or
a Table 1 results file (`keras_attnconv.training.table1`), whose finished run
of the same model then is the base: a run recorded in an earlier session
needs no second training to be compared with.
"""

import json
import math
from pathlib import Path

from keras_attnconv.training.run_directory import RunDirectory
from keras_attnconv.training.runs import BEFORE_THE_FIELD, same_run
from keras_attnconv.training.table1 import changes_label, run_record
from keras_attnconv.utils.checks import check_path
from keras_attnconv.utils.files import file_digest
from keras_attnconv.utils.reports import percent

#: Settings that name a run rather than say how it trains.
_NAMES = ("name",)


def setting_changes(base_settings, settings):
    """The settings in which a run differs from its base, at their values in the run.

    A setting that one of them was recorded without counts at the value that
    does what the package did before it existed (`BEFORE_THE_FIELD`).
    """
    run = {**BEFORE_THE_FIELD, **settings}  # `same_run` fills in the base's
    return {k: run.get(k) for k in same_run(base_settings, run) if k not in _NAMES}


def variant_label(changes):
    """How a table names a run by its changes: ``cutout 16, label_smoothing 0.1``."""
    return changes_label(changes) or "the base's settings (a rerun)"


def _base_record(base, model, digest):
    """The base run's record: a run directory's, or the finished run of `model` in a Table 1 results file."""
    path = Path(base)
    if not path.is_file():
        return _finished_record(path)
    results = json.loads(path.read_text())
    if results.get("data", {}).get("digest") != digest:
        raise ValueError(
            f"The base's results file was measured on other data ({results.get('data', {}).get('digest')}): "
            f"its runs cannot be a base for these. Received: base={str(base)!r}"
        )
    finished = [r for r in results.get("runs", []) if r.get("finished") and r.get("model") == model]
    if not finished:
        raise ValueError(f"{str(base)!r} holds no finished run of `{model}` to be the base. Received: base={base!r}")
    return finished[0]


def _finished_record(path):
    """The record of the run directory at `path` (`run_record`), which must be a finished run."""
    run = RunDirectory(check_path("run", path))
    if run.is_ours() and not run.metrics_file.exists():
        raise ValueError(
            f"{str(path)!r} is not finished (no metrics.json): its accuracy is that of a schedule cut short, "
            f"not of its choices. Received: run={str(path)!r}"
        )
    return run_record(path)


def final_training_accuracy(record):
    """The training accuracy of a record's last epoch, or None where its history has none."""
    return (record["history"].get("accuracy") or [None])[-1]


def _with_gain(record, base, changes):
    """`record` with its changes, its label and its gain over `base`, in points with its standard error."""
    return {
        **record,
        "changes": changes,
        "variant": variant_label(changes),
        "final_training_accuracy": final_training_accuracy(record),
        "gain_points": 100 * (record["test_accuracy"] - base["test_accuracy"]),
        # Independent runs on independent draws of the error: the two standard errors add in quadrature.
        "gain_standard_error_points": 100 * math.hypot(record["standard_error"], base["standard_error"]),
    }


def choice_gains_report(runs, *, base, data_name, data_file, command=None, earlier=None):
    """The gains of `runs` (finished run directories) over `base`, as ``attnconv choices`` writes them.

    Args:
        runs: run directories that trained the base's model with some settings changed.
        base: a run directory, or a Table 1 results file whose finished run of that model is the base.
        data_name: what the data is ("CIFAR-10 (JPEG copy)").
        data_file: the file the data came from, whose digest is recorded (and checked against the base's file).
        command: the command line that made the report.
        earlier: a report made before (the results file, read), whose runs stay unless a run with the same
            changes replaces them. Its data and its base must be these.

    Returns:
        ``{"data", "base", "runs", "commands"}``: the base with no gain, then each run with its ``changes``,
        ``variant`` label, ``gain_points`` and ``gain_standard_error_points``.
    """
    if not runs:
        raise ValueError("Name at least one run to compare with the base. Received: runs=[]")
    if Path(base).resolve() in {Path(path).resolve() for path in runs}:
        raise ValueError(f"The base is also among the runs: its gain over itself is 0. Received: base={str(base)!r}")
    digest = file_digest(data_file, "data_file")
    records = [_finished_record(path) for path in runs]
    models = sorted({record["model"] for record in records})
    if len(models) > 1:
        raise ValueError(
            f"The runs train different models ({', '.join(models)}): a choice's gain is measured on one model. "
            f"Received: runs={[str(path) for path in runs]}"
        )
    base_record = _base_record(base, models[0], digest)
    if base_record["model"] != models[0]:
        raise ValueError(
            f"The base trains `{base_record['model']}`, the runs `{models[0]}`: a choice's gain is measured on one "
            f"model. Received: base={str(base)!r}"
        )
    for path, record in zip(runs, records):  # (the data's path is no setting: it differs between machines)
        if record["test_examples"] != base_record["test_examples"]:
            raise ValueError(
                f"{str(path)!r} was evaluated on {record['test_examples']} test images, the base on "
                f"{base_record['test_examples']}: a gain compares accuracies on one test set. Received: "
                f"run={str(path)!r}"
            )
    measured = [
        _with_gain(record, base_record, setting_changes(base_record["settings"], record["settings"]))
        for record in records
    ]
    if earlier is not None:
        if earlier["data"]["digest"] != digest:
            raise ValueError(
                f"The earlier results were measured on other data ({earlier['data']['digest']}): they cannot "
                f"share a table. Received: data_file={str(data_file)!r} ({digest})"
            )
        if (earlier["base"]["settings"], earlier["base"]["test_accuracy"]) != (
            base_record["settings"],
            base_record["test_accuracy"],
        ):
            raise ValueError(
                f"The earlier results have another base run (`{earlier['base']['recipe']}`, "
                f"{earlier['base']['test_accuracy']:.4f}): their gains are not over this one. Received: base={base!r}"
            )
        replaced = {run["variant"] for run in measured}
        measured = [run for run in earlier["runs"] if run["variant"] not in replaced] + measured
    return {
        "commands": [*(earlier or {}).get("commands", []), command],
        "data": {"name": data_name, "file": Path(data_file).name, "digest": digest},
        "base": base_record,
        "runs": measured,
    }


def choice_gains_markdown(report):
    """The report as markdown: the base, then each run's changes, test accuracy and gain."""
    base = report["base"]
    made = "; then ".join(f"`{command}`" for command in report["commands"] if command)
    lines = [
        f"# Training choices on {report['data']['name']}: `{base['recipe']}`",
        "",
        f"Each run against the base run, `{base['recipe']}` ({base['epochs']} epochs, `{base['model']}`): "
        f"test accuracy of the last epoch's weights on the {base['test_examples']:,} test images; gain: the "
        "run's minus the base's, in points, with the standard errors of two independent runs added in quadrature.",
        "",
        "| variant | test accuracy (± s.e.) | gain, points (± s.e.) | training accuracy | minutes | device |",
        "|---|---|---|---|---|---|",
        f"| the base | {percent(base['test_accuracy'], 2)} ± {percent(base['standard_error'], 2)} | +0.00 | "
        f"{percent(final_training_accuracy(base), 2)} | {base['training_minutes']:.1f} | "
        f"{base['device']} |",
    ]
    lines += [
        f"| {run['variant']} | {percent(run['test_accuracy'], 2)} ± {percent(run['standard_error'], 2)} | "
        f"{run['gain_points']:+.2f} ± {run['gain_standard_error_points']:.2f} | "
        f"{percent(run['final_training_accuracy'], 2)} | {run['training_minutes']:.1f} | {run['device']} |"
        for run in report["runs"]
    ]
    lines += [
        "",
        f"Data: `{report['data']['file']}` ({report['data']['digest']}).",
        f"Made by {made or 'a command not recorded'}.",
        *_machines_line([base, *report["runs"]]),
        "",
        "Package commits: "
        + ", ".join(f"{run.get('variant', 'the base')} {run['commit']}" for run in [base, *report["runs"]])
        + ".",
    ]
    return "\n".join(lines) + "\n"


def _machines_line(records):
    """The machines the runs trained on, as the lines of markdown that say so (none where no run recorded its)."""
    machines = list(dict.fromkeys(record["machine"] for record in records if record.get("machine")))
    return ["", f"Machine{'s' if len(machines) > 1 else ''}: {'; '.join(machines)}."] if machines else []
