"""Files the package writes safely: atomic writes, strict JSON, locks, and the checks before a write."""

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from keras_attnconv.utils.checks import check_path
from keras_attnconv.utils.staging import dead_writers_temporaries, is_temporary, remove, temporary_name


def read_json(path):
    """The JSON value in the file `path`; a file nested too deeply to parse is a ValueError, as any bad JSON is."""
    text = Path(path).read_text()
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def read_json_object(path, context):
    """The JSON object (a dict) in the file `path`; anything else is one ValueError naming the file, then `context`.

    `context` says whose file it is and what was received (``"Received: preset='p'"``).
    """
    try:
        value = read_json(path)
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} cannot be read ({error}): {context}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object: {context}")
    return value


def _temporary_affixes(name):
    """(prefix, suffix) of the temporaries `write_atomically` makes for the file `name` (`staging.temporary_name`)."""
    return f"{name}.", Path(name).suffix


def is_temporary_of(entry, name):
    """Whether the file name `entry` is a temporary `write_atomically` makes for the file `name` (of any writer)."""
    return is_temporary(entry, *_temporary_affixes(name))


def write_atomically(path, write):
    """Calls ``write(tmp_path)`` then renames onto `path`: readers never see half a file.

    The temporary is hidden beside `path` under a name only the package makes
    (`staging.temporary_name`); those that killed writers of `path` left are
    removed first, so a kill before the rename leaves nothing for good.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    affixes = _temporary_affixes(path.name)
    for leftover in dead_writers_temporaries(path.parent, *affixes):
        remove(leftover)
    tmp = path.parent / temporary_name(*affixes)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def file_lock(path, blocking=True):
    """Holds the operating system's exclusive lock (flock) on the file `path`, created if missing.

    The lock goes with the process however it ends, so a killed holder never
    leaves a stale one. With ``blocking=False``, a lock held elsewhere is a
    BlockingIOError at once. Yields the open file, or None where the system
    has no flock (not POSIX: no lock).
    """
    try:
        import fcntl
    except ModuleNotFoundError:
        yield None
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        try:
            yield handle
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_writable(path, argument, file=False, beside=False):
    """Raises (naming `argument` and `path`) unless `path` could be written: before any work that ends writing it.

    `path` is a directory (created if missing, with its parents) or, with
    `file`, a file: then it must not be a directory. With `beside`, the
    directory is written beside itself (staged in its parent and renamed).
    The nearest existing directory on the way must be writable; a file on
    the way is an error.
    """
    check_path(argument, path)
    path = Path(path)
    if file and path.is_dir():
        raise IsADirectoryError(f"Cannot write {argument}={str(path)!r}: it is a directory.")
    existing = _nearest_existing(path.parent if file or beside else path)
    if not existing.is_dir():
        raise NotADirectoryError(f"Cannot write to {argument}={str(path)!r}: {existing} is a file, not a directory.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"Cannot write to {argument}={str(path)!r}: {existing} is not writable.")
    # The permission bits do not say it all: a pseudo file system (/proc) refuses new files even to root, whom
    # os.access lets through. A nameless temporary file, gone when closed, asks the file system itself.
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        reason = error.strerror or error
        raise type(error)(
            f"Cannot write to {argument}={str(path)!r}: {existing} takes no new file ({reason})."
        ) from None


def _nearest_existing(path):
    """`path` or its nearest ancestor that exists (what a write below it would be decided by)."""
    return next(p for p in (path, *path.parents) if p.exists())


def check_free_space(directory, needed_bytes, what, margin=1.25):
    """Raises OSError (ENOSPC) naming `what` and `directory` if it lacks room for `needed_bytes` (with a margin).

    Checked before a write that a full disk would break badly: HDF5 files
    crash the process after a failed write.
    """
    directory = Path(directory)
    free = shutil.disk_usage(_nearest_existing(directory)).free
    if free < margin * needed_bytes + 2**20:
        raise OSError(
            errno.ENOSPC,
            f"No space left for {what} in {directory}: it needs about "
            f"{needed_bytes / 2**20:.1f} MiB and {free / 2**20:.1f} MiB are free. Free some "
            f"space and run the same command again.",
        )


def is_full_disk(error):
    """Whether `error` is a write's failure for want of space: an OSError with ENOSPC, or TensorFlow's error of
    a file it could not write (a SavedModel's variables: ResourceExhaustedError, its message the system's)."""
    if isinstance(error, OSError):
        return error.errno == errno.ENOSPC
    return type(error).__module__.startswith("tensorflow") and os.strerror(errno.ENOSPC) in str(error)


def file_digest(path, argument="path"):
    """``sha256:<hex>`` of the file at `path`; one that cannot be read is an error naming `argument`."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as data:
            for block in iter(lambda: data.read(1 << 20), b""):
                digest.update(block)
    except OSError as error:  # missing, a folder, unreadable: the same kind of error, saying which argument
        raise type(error)(
            f"`{argument}` must be a file to read and digest: {str(path)!r} cannot be read "
            f"({error.strerror or error}). Received: {argument}={str(path)!r}"
        ) from None
    return f"sha256:{digest.hexdigest()}"


def write_json(path, data):
    """Writes `data` as indented, key-sorted, strict JSON, atomically; a NaN or infinity is an error, nothing written.

    JSON has no NaN or Infinity: Python's bare ``NaN`` tokens would make the file unreadable to other parsers.
    """
    try:
        text = json.dumps(data, indent=2, sort_keys=True, allow_nan=False)
    except ValueError as error:
        raise ValueError(f"Cannot write {path} as JSON: {error}. Received: path={str(path)!r}") from None
    write_atomically(path, lambda tmp: tmp.write_text(text + "\n"))


#: The formats every figure is written in: PNG for the eye, SVG (vector, text kept as text) for papers.
FIGURE_FORMATS = ("png", "svg")


def figure_paths(base):
    """The files of a figure written as `base` (a path without suffix): one per `FIGURE_FORMATS`."""
    return [Path(f"{os.fspath(base)}.{suffix}") for suffix in FIGURE_FORMATS]


def write_figure(figure, base, dpi=100):
    """Writes a matplotlib `figure` as each of `figure_paths(base)`, each atomically; returns those paths.

    The SVG keeps its text as text (smaller, searchable, editable) and carries
    no date, so the same figure gives the same file.
    """
    import matplotlib

    paths = figure_paths(base)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "keras_attnconv"}):
        for path in paths:
            metadata = {"Date": None} if path.suffix == ".svg" else {"Software": "keras_attnconv"}
            write_atomically(
                path,
                lambda tmp, path=path, metadata=metadata: figure.savefig(
                    tmp, format=path.suffix[1:], dpi=dpi, metadata=metadata
                ),
            )
    return paths
