"""The run directory of `attnconv train`: its one owner, which alone knows its layout.

A run directory holds:

- ``.keras_attnconv.json``: the mark that makes it a run directory of the
  package (`keras_attnconv.utils.ownership`), written before anything else;
- ``config.json``: the resolved recipe;
- ``backup/``: the resumable state of the last epochs (`callbacks.ResumableBackup`);
- ``checkpoints/best.keras`` and ``best.json``: the best model so far, and its epoch and score;
- ``logs/``: TensorBoard's (where TensorFlow is installed); ``history.csv``: every epoch's metrics;
- ``centers_history.npz``: the attention centers per epoch (quadratic and Gaussian models);
- ``epoch_seconds.json``: how long each epoch took (`analysis.throughput.Throughput`), for the run's images per second;
- ``preset/``: the best model as a preset (`keras_attnconv.models.presets`), once trained;
- ``metrics.json``: written last, atomically: it marks the run finished, and a finished run is never changed;
- ``export.json``: the SavedModel export of a finished run (`attnconv train` exports after training);
- ``figures/``: what ``attnconv plot`` draws of the run;
- ``.lock``: held by the process that trains in it.

The package trains only in a directory that is absent, empty, or carries its
mark as a run directory, and removes only the records listed here, of a run
that never completed an epoch. A mark alone licenses no change to what is
beside it (a mark is easily copied): a run writes its ``config.json``, which
names its directory, right after its mark and before any other record, so
records without that config are not a run's, and a run's records are removed
only where its ``config.json`` names this very directory
(`RunDirectory.check_records_are_its_own`).

Pure Python: no framework is imported, but by `RunDirectory.load_best_checkpoint` (Keras, when it runs).
"""

import contextlib
import itertools
import json
import os
import shutil
from pathlib import Path

from keras_attnconv.utils.checks import check_path
from keras_attnconv.utils.files import check_writable, file_lock, is_temporary_of, read_json_object, write_json
from keras_attnconv.utils.ownership import ForeignDirectoryError, check_owned, mark_of, visible_entries, write_mark


class RunInUseError(RuntimeError):
    """Another process is training in this run directory."""


class RunDirectory:
    """One run directory: the paths of its records, its mark, its lock and its state.

    Args:
        path: the directory (it need not exist yet).
    """

    KIND = "run"
    CONFIG = "config.json"
    METRICS = "metrics.json"
    EXPORT_RECORD = "export.json"
    BACKUP = "backup"
    CHECKPOINTS = "checkpoints"
    LOGS = "logs"
    HISTORY = "history.csv"
    CENTERS = "centers_history.npz"
    EPOCH_SECONDS = "epoch_seconds.json"
    PRESET = "preset"
    FIGURES = "figures"
    LOCK = ".lock"
    #: What a run writes before it finishes, all of it a function of its configuration: what a run of another
    #: configuration that never completed an epoch leaves, and a corrected command removes.
    RECORDS = (BACKUP, CHECKPOINTS, LOGS, HISTORY, CENTERS, EPOCH_SECONDS, PRESET)

    #: The records that decide what a run does next (whether an epoch's model is the best so far, whether the
    #: preset is still to be made): a process that writes into a scratch directory starts from their copy.
    DECISIONS = (CHECKPOINTS, PRESET)

    def __init__(self, path):
        self.path = Path(path)

    def __repr__(self):
        return f"RunDirectory({str(self.path)!r})"

    def __str__(self):
        return str(self.path)

    def __fspath__(self):
        return str(self.path)

    config_file = property(lambda self: self.path / self.CONFIG)
    metrics_file = property(lambda self: self.path / self.METRICS)
    export_record = property(lambda self: self.path / self.EXPORT_RECORD)
    backup_dir = property(lambda self: self.path / self.BACKUP)
    best_checkpoint = property(lambda self: self.path / self.CHECKPOINTS / "best.keras")
    best_record = property(lambda self: self.path / self.CHECKPOINTS / "best.json")
    logs_dir = property(lambda self: self.path / self.LOGS)
    history = property(lambda self: self.path / self.HISTORY)
    centers_history = property(lambda self: self.path / self.CENTERS)
    epoch_seconds = property(lambda self: self.path / self.EPOCH_SECONDS)
    preset_dir = property(lambda self: self.path / self.PRESET)
    figures_dir = property(lambda self: self.path / self.FIGURES)

    @classmethod
    def numbered(cls, runs_dir, name):
        """``runs_dir/name``, ``name-1``, ``name-2``, ...: a recipe's run directories in the order they are made."""
        base = Path(runs_dir) / name
        yield cls(base)
        for index in itertools.count(1):
            yield cls(base.with_name(f"{base.name}-{index}"))

    def is_ours(self):
        """Whether the directory carries the package's mark as a run directory."""
        return mark_of(self.path) == self.KIND

    def is_free(self):
        """Whether nothing is there yet: the directory is absent or empty (then a run may claim it)."""
        return not self.path.exists() or (
            self.path.is_dir() and mark_of(self.path) is None and not visible_entries(self.path)
        )

    def is_finished(self):
        """Whether it holds a finished run of the package (``metrics.json``)."""
        return self.is_ours() and self.metrics_file.exists()

    def check(self, argument="run_dir"):
        """Raises (naming `argument`) unless a run could be written here (writable, free or ours); changes nothing."""
        check_writable(self.path, argument)
        check_owned(self.path, self.KIND, argument)

    def claim(self):
        """Creates the directory (and its parents) and marks it as a run directory; the mark comes first."""
        self.check()
        if not self.is_ours():
            write_mark(self.path, self.KIND)

    @contextlib.contextmanager
    def lock(self):
        """Holds an exclusive lock on the run (``.lock``) for the duration; a second holder gets RunInUseError.

        The lock is the operating system's (`utils.file_lock`): it is released
        when the holder exits, however it exits, so a killed run never leaves a
        stale lock. Only a run directory of the package is locked.
        """
        if not self.is_ours():
            raise ForeignDirectoryError(
                f"{self.path} is not a run directory of keras_attnconv. Received: run_dir={str(self.path)!r}"
            )
        path = self.path / self.LOCK
        with contextlib.ExitStack() as stack:
            try:
                handle = stack.enter_context(file_lock(path, blocking=False))
            except BlockingIOError:
                holder = path.read_text().strip() or "another process"
                raise RunInUseError(
                    f"{self.path} is in use by {holder}: wait for it to finish or pass another "
                    f"--run-dir. Received: run_dir={str(self.path)!r}"
                ) from None
            if handle is not None:
                handle.seek(0)
                handle.truncate()
                handle.write(f"process {os.getpid()}\n")
                handle.flush()
            yield

    def read_config(self):
        """The run's ``config.json`` (None if there is none), a damaged one being an error naming it."""
        if not self.config_file.exists():
            return None
        return read_json_object(
            self.config_file,
            f"the run directory was damaged. Pass another --run-dir. Received: run_dir={str(self.path)!r}",
        )

    def load_best_checkpoint(self):
        """The model of ``checkpoints/best.keras``, uncompiled; a damaged file is one ValueError naming it.

        Keras reports an archive cut short as "File not found", of a file that
        is there: the error says what is wrong with it instead.
        """
        import zipfile

        import keras

        path = self.best_checkpoint
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is absent: the run has no best model yet. Received: run_dir={str(self.path)!r}"
            )
        try:
            return keras.saving.load_model(path, compile=False)
        except Exception as error:  # noqa: BLE001 - Keras' and h5py's errors for a damaged archive
            reason = " ".join(str(error).split()) if zipfile.is_zipfile(path) else "not a whole .keras zip archive"
            raise ValueError(
                f"{path} cannot be loaded ({reason}); it was damaged after training wrote it. "
                f"Received: run_dir={str(self.path)!r}"
            ) from None

    def path_from_preset(self):
        """Where the run is, seen from its preset (what the preset's metadata records: never an absolute path)."""
        return os.path.relpath(self.path, self.preset_dir)

    def write_config(self, resolved):
        write_json(self.config_file, resolved)

    def has_completed_epoch(self):
        """Whether a backup of a completed epoch was published (`callbacks.ResumableBackup`'s pointer)."""
        return (self.backup_dir / "latest.json").exists()

    def check_records_are_its_own(self, starting_anew):
        """Raises `ForeignDirectoryError` where the folder and the run's own records disagree; changes nothing.

        A run writes ``config.json`` (with its ``run_dir``) right after its mark
        and before any other record: a folder with records but no config holds
        what is not a run's (a copied mark beside a user's files). Starting
        anew removes records, so it also needs the config to name this very
        folder: a copy of another run, or a user's config.json, does not.
        """
        received = f"Received: run_dir={str(self.path)!r}"
        config = self.read_config()
        if config is None:
            records = [
                name
                for name in visible_entries(self.path)
                if name != self.LOCK and not is_temporary_of(name, self.CONFIG)
            ]
            if records:
                raise ForeignDirectoryError(
                    f"{self.path} holds {', '.join(records[:5])} beside a run's mark but no {self.CONFIG}, which a "
                    f"run writes before any other record: they are not a run's, and never changed. Pass another "
                    f"--run-dir. {received}"
                )
        elif starting_anew and not self._is_this_folder(config.get("run_dir")):
            raise ForeignDirectoryError(
                f"{self.config_file} names run_dir={config.get('run_dir')!r}, not this folder: what it holds is not "
                f"this run's to remove, and never changed. Pass another --run-dir. {received}"
            )

    def _is_this_folder(self, recorded):
        try:
            return isinstance(recorded, str) and os.path.samefile(recorded, self.path)
        except OSError:  # no such path (here, from this working directory): not this folder
            return False

    def start_anew(self):
        """Removes the records (`RECORDS`) of a run that never completed an epoch; nothing else.

        Only a run whose ``config.json`` names this folder (`check_records_are_its_own`).
        """
        if not self.is_ours() or self.has_completed_epoch() or self.metrics_file.exists():
            raise ValueError(
                f"Only the records of an unfinished run of keras_attnconv that never completed an "
                f"epoch are removed. Received: run_dir={str(self.path)!r}"
            )
        self.check_records_are_its_own(starting_anew=True)
        for name in self.RECORDS:
            path = self.path / name
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)

    def copy_decisions_to(self, scratch):
        """Copies the records that decide a run's next steps (`DECISIONS`) into `scratch`, a RunDirectory.

        The processes of a distributed run must take the same steps (saving and evaluating a model involve
        them all); the one that writes decides from its records, the others from this copy of them.
        """
        for name in self.DECISIONS:
            source = self.path / name
            if source.is_dir():
                shutil.copytree(source, scratch.path / name, dirs_exist_ok=True)

    def write_metrics(self, metrics):
        """Writes ``metrics.json``, atomically: from then on the run is finished."""
        write_json(self.metrics_file, metrics)

    def finished_metrics(self):
        """The ``metrics.json`` of a finished run, with its ``run_dir`` (as `training.train` returns them)."""
        return {**json.loads(self.metrics_file.read_text()), "run_dir": str(self.path)}

    def record_export(self, path):
        """Records that the run's SavedModel export completed as `path` (``export.json``)."""
        write_json(self.export_record, {"export": str(path)})

    def is_exported(self):
        return self.export_record.exists()


def preset_of(source):
    """The preset directory of `source`: a run directory (its ``preset/``) or a preset directory itself."""
    from keras_attnconv.models.presets import is_preset

    source = Path(check_path("source", source))
    if is_preset(RunDirectory(source).preset_dir):
        return RunDirectory(source).preset_dir
    if is_preset(source):
        return source
    raise FileNotFoundError(
        f"{str(source)!r} is neither a finished training run (with preset/) nor a preset "
        f"directory (config.json, model.weights.h5). Received: source={str(source)!r}"
    )
