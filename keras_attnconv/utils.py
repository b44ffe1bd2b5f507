"""Small helpers for every level of the package: argument checks with Keras-style messages
("... Received: name=value"), atomic file writes and a description of the machine.

Pure Python: importing this module imports no framework, so the command line
can validate its arguments before TensorFlow or JAX loads.
"""

import contextlib
import dataclasses
import difflib
import errno
import json
import math
import numbers
import os
import platform
import shutil
from pathlib import Path


def closest_names(name, candidates):
    """Names in `candidates` closest to `name`, for 'did you mean' messages."""
    return difflib.get_close_matches(str(name), [str(c) for c in candidates], n=3, cutoff=0.3)


def did_you_mean(name, candidates):
    """`` Did you mean 'x'?`` for the closest candidates, or an empty string."""
    suggestions = closest_names(name, candidates)
    return f" Did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""


def plain_numbers(instance):
    """Gives the fields of a (frozen) dataclass that hold NumPy numbers Python's ``int`` and ``float`` instead.

    NumPy scalars are valid numbers for the checks, but a config must stay
    JSON-serializable (``config.json``, ``get_config``); booleans stay as they are.
    """
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if isinstance(value, (bool, int, float)) or not isinstance(value, numbers.Real):
            continue
        object.__setattr__(instance, field.name, int(value) if isinstance(value, numbers.Integral) else float(value))


def check_known_fields(values, fields, source):
    """Raises ValueError naming the first key of `values` not in `fields` (with the closest ones and all of them)."""
    for key in values:
        if key not in fields:
            raise ValueError(f"Unknown {source} field {key!r}.{did_you_mean(key, fields)} "
                             f"Valid fields: {', '.join(sorted(fields))}. Received: {key}={values[key]!r}")


def check_positive_int(name, value, allow_none=False):
    """Raises ValueError naming `name` unless `value` is an integer >= 1 (or None when allowed)."""
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        expected = "None or a positive integer" if allow_none else "a positive integer"
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")


def check_real(name, value, low=-math.inf, high=math.inf, low_open=False, high_open=False):
    """Raises ValueError naming `name` unless `value` is a finite real number in the given interval."""
    interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        raise ValueError(f"`{name}` must be a finite number in {interval}. Received: {name}={value!r}")


def check_rate(name, value):
    """Raises ValueError naming `name` unless `value` is a real number in [0, 1) (a dropout rate)."""
    check_real(name, value, 0.0, 1.0, high_open=True)


def check_positive_number(name, value):
    """Raises ValueError naming `name` unless `value` is a finite real number > 0."""
    check_real(name, value, low=0.0, low_open=True)


def check_bool(name, value):
    """Raises ValueError naming `name` unless `value` is True or False (not a string such as "maybe")."""
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be true or false. Received: {name}={value!r}")


def check_seed(name, value):
    """Raises ValueError naming `name` unless `value` is None or an integer seed in [0, 2**32) (Keras' and NumPy's)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)
                              or not 0 <= value < 2**32):
        raise ValueError(f"`{name}` must be None or an integer in [0, 2**32). Received: {name}={value!r}")


def check_choice(name, value, choices):
    """Raises ValueError naming `name` unless `value` is one of `choices` (suggesting the closest)."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {', '.join(map(repr, choices))}."
                         f"{did_you_mean(value, choices)} Received: {name}={value!r}")


#: How a value that can be omitted is omitted on the command line and in a recipe (TOML has no null).
NONE_WORDS = ("none", "null")


def none_word(value):
    """None for a string that says none (`NONE_WORDS`, any case), else `value`: the one parser of omitted values."""
    return None if isinstance(value, str) and value.strip().lower() in NONE_WORDS else value


#: The longest name (path component) the package accepts: a file system's limit is 255 bytes, and an owner
#: stages a directory under a hidden name that adds about 40 characters to it.
MAX_NAME_BYTES = 200


def check_path(argument, path):
    """Raises ValueError naming `argument` unless `path` is a path the system can take: before any work.

    No NUL byte (no system call takes one) and no name longer than
    `MAX_NAME_BYTES`; the one check of both, for every path and name given.
    """
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text:
        raise ValueError(f"`{argument}` must be a non-empty path. Received: {argument}={path!r}")
    if "\0" in text:
        raise ValueError(f"`{argument}` cannot hold a NUL byte. Received: {argument}={text!r}")
    longest = max(Path(text).parts, key=lambda part: len(part.encode(errors="surrogateescape")), default="")
    if len(longest.encode(errors="surrogateescape")) > MAX_NAME_BYTES:
        shown = f"{text[:60]}...({len(text)} characters)"
        raise ValueError(f"`{argument}` has a name of {len(longest)} characters; at most {MAX_NAME_BYTES} bytes are "
                         f"allowed. Received: {argument}={shown!r}")
    return path


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


def report_paths(output):
    """The JSON and markdown files of a report written to `output`: ``(X.json, X.md)`` whichever of them is given.

    Any other name is the JSON file, with the markdown beside it as ``X.md``:
    never one file for both formats.
    """
    base, suffix = os.path.splitext(os.fspath(output))
    json_path = f"{base}.json" if suffix.lower() == ".md" else os.fspath(output)
    return json_path, f"{base}.md"


def write_atomically(path, write):
    """Calls ``write(tmp_path)`` then renames onto `path`: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}{path.suffix}")
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
        raise OSError(errno.ENOSPC, f"No space left for {what} in {directory}: it needs about "
                                    f"{needed_bytes / 2**20:.1f} MiB and {free / 2**20:.1f} MiB are free. Free some "
                                    f"space and run the same command again.")


def write_json(path, data):
    """Writes `data` as indented, key-sorted, strict JSON, atomically; a NaN or infinity is an error, nothing written.

    JSON has no NaN or Infinity: Python's bare ``NaN`` tokens would make the file unreadable to other parsers.
    """
    try:
        text = json.dumps(data, indent=2, sort_keys=True, allow_nan=False)
    except ValueError as error:
        raise ValueError(f"Cannot write {path} as JSON: {error}. Received: path={str(path)!r}") from None
    write_atomically(path, lambda tmp: tmp.write_text(text + "\n"))


def write_report(output, results, markdown):
    """Writes `results` as JSON and the `markdown` text beside it, each atomically (`report_paths`)."""
    json_path, markdown_path = report_paths(output)
    write_json(json_path, results)
    write_atomically(markdown_path, lambda tmp: tmp.write_text(markdown.rstrip("\n") + "\n"))


def machine():
    """The machine and software a measurement ran on, for results files."""
    import keras  # here, not at the top: the rest of this module must not load a framework

    return {"backend": keras.backend.backend(), "keras": keras.__version__, "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "platform": platform.platform()}
