"""Which run directory a configuration trains in: the configured or next numbered one, its finished twin, its checks."""

import dataclasses
import itertools

from keras_attnconv.training.fine_tuning import init_from_digest
from keras_attnconv.training.run_directory import RunDirectory

#: Fields added to `TrainConfig` after runs were recorded without them, at the value that does what the package did
#: before (min_warmup_epochs: no minimum; its default, 6, would resume such a run with a longer warm-up).
BEFORE_THE_FIELD = {
    "min_warmup_epochs": 0.0,
    "label_smoothing": 0.0,
    "ema_momentum": 0.0,
    "cutout": 0,
    "init_from": None,
}


def resolve_run_dir(config):
    """The `RunDirectory` of `config`: the configured one, or the first numbered one that is free or unfinished.

    Numbered directories that hold a finished run, or something that is not a
    run of the package, are passed over (never written).
    """
    if config.run_dir:
        return RunDirectory(config.run_dir)
    return next(
        run
        for run in RunDirectory.numbered(config.runs_dir, config.name)
        if run.is_free() or (run.is_ours() and not run.metrics_file.exists())
    )


def finished_run(config):
    """The latest finished `RunDirectory` of `config` with the same settings (`same_run`), or None."""
    if config.run_dir:
        candidates = [RunDirectory(config.run_dir)]
    else:
        candidates = itertools.takewhile(
            lambda run: not run.is_free(), RunDirectory.numbered(config.runs_dir, config.name)
        )
    finished = None
    for candidate in candidates:
        if candidate.is_finished():
            finished = candidate
        elif candidate.is_ours():  # the unfinished run: the numbers after it are not made yet
            break
    if finished is None:
        return None
    return None if same_run(finished.read_config() or {}, resolved_config(config, finished)) else finished


def resolved_config(config, run):
    """The dict written to ``config.json``: the config with its run directory, and what its `init_from` holds.

    A fine-tuning run records the digest of the preset it starts from
    (``init_from_digest``, `fine_tuning.init_from_digest`): the same
    command with the preset changed is another configuration, which never
    resumes an unfinished run of the first nor counts as its finished run.
    """
    resolved = {**dataclasses.asdict(config), "run_dir": str(run)}
    if config.init_from is not None:
        resolved["init_from_digest"] = init_from_digest(config.init_from)
    return resolved


def same_run(saved, resolved):
    """The fields (other than verbosity, place and export) in which two resolved configs differ.

    A field that a run written by an earlier version does not have counts
    at `BEFORE_THE_FIELD`'s value, what that version did: a field added
    since never makes an unfinished run of before unresumable, nor resumes
    it with another behaviour.
    """
    saved = {**BEFORE_THE_FIELD, **saved}
    ignored = ("verbose", "run_dir", "export_dir", "export_name")
    return sorted(k for k in set(saved) | set(resolved) if k not in ignored and saved.get(k) != resolved.get(k))


def check_same_run(run, resolved):
    """Whether `run` holds a run of another configuration that never completed an epoch (to start anew).

    Raises for a directory that is not a run of the package or a finished run,
    which are never touched, for an unfinished run of another configuration
    with a completed epoch, which is never lost, and where the folder and the
    run's own records disagree (`RunDirectory.check_records_are_its_own`).
    """
    run.check()
    if run.metrics_file.exists():
        raise FileExistsError(
            f"{run} holds a finished run, which is never overwritten: pass another --run-dir, or "
            f"none for the next free one under runs_dir. Received: run_dir={str(run)!r}"
        )
    saved = run.read_config()
    changed = same_run(saved, resolved) if saved is not None else []
    if changed and run.has_completed_epoch():
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {resolved.get(k)!r}" for k in changed)
        raise ValueError(
            f"{run} holds an unfinished run with a different configuration ({details}) and a "
            "completed epoch. Resume it with the same settings, or pass another --run-dir."
        )
    run.check_records_are_its_own(starting_anew=bool(changed))
    return bool(changed)
