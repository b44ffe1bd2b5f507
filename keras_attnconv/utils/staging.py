"""Hidden temporaries: a file or directory is written under a hidden name and renamed into place when complete.

A temporary is named ``.<prefix>tmp-<random>-<host>-<pid><suffix>`` (`temporary_name`):
unique per writer, a name only the package makes, and traceable to its
process, so that the next writer removes those of writers that were killed,
and never a live writer's. A name that does not fully match is not the
package's (a user's ``.tmp-notes``) and is never removed, however old.
"""

import ctypes
import errno
import glob
import os
import re
import secrets
import shutil
import socket
import time
from pathlib import Path

# A temporary of another host (shared storage), or of a system without a pid check, is removed only after this
# long, and only when its whole name is the package's: no export, preset or file write takes a day.
STALE_STAGING_SECONDS = 24 * 3600


def temporary_name(prefix="", suffix=""):
    """A fresh hidden name for a temporary of this process: ``.<prefix>tmp-<random>-<host>-<pid><suffix>``.

    `suffix` ends the name where a writer needs it (``.keras``, ``.npz``: the
    file type some writers infer from the name).
    """
    return f".{prefix}tmp-{secrets.token_hex(4)}-{socket.gethostname()}-{os.getpid()}{suffix}"


def _temporary_pattern(prefix, suffix):
    return re.compile(rf"\.{re.escape(prefix)}tmp-[0-9a-f]{{8}}-(?P<host>.+)-(?P<pid>\d+){re.escape(suffix)}")


def is_temporary(name, prefix="", suffix=""):
    """Whether `name` is one `temporary_name(prefix, suffix)` makes (of any writer, live or dead)."""
    return _temporary_pattern(prefix, suffix).fullmatch(name) is not None


def new_staging(parent, prefix=""):
    """A fresh, empty staging directory in `parent` (created if needed)."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / temporary_name(prefix)
    staging.mkdir()
    return staging


def _pid_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def dead_writers_temporaries(parent, prefix="", suffix=""):
    """The temporaries named by `temporary_name(prefix, suffix)` in `parent` whose writer was killed, sorted.

    Recognised by their whole name, never by age alone: a writer of this host
    is dead when its pid is; one of another host (whose pids mean nothing
    here) after `STALE_STAGING_SECONDS`. Any other name is left.
    """
    pattern = _temporary_pattern(prefix, suffix)
    dead = []
    for entry in sorted(Path(parent).glob(f".{glob.escape(prefix)}tmp-*")):
        match = pattern.fullmatch(entry.name)
        if match is None:  # not a name the package makes: the user's
            continue
        try:
            # A pid only identifies a process on this host (the directory may be shared
            # storage), and os.kill(pid, 0) would terminate it on Windows.
            if match["host"] == socket.gethostname() and os.name == "posix":
                stale = not _pid_alive(int(match["pid"]))
            else:
                stale = time.time() - entry.lstat().st_mtime > STALE_STAGING_SECONDS
        except FileNotFoundError:  # removed meanwhile by another writer
            continue
        if stale:
            dead.append(entry)
    return dead


def remove_stale_staging(parent, prefix=""):
    """Removes the staging directories with `prefix` in `parent` whose writer was killed; never a live writer's."""
    for staging in dead_writers_temporaries(parent, prefix):
        remove(staging)


def remove(path):
    """Removes a staging entry: a directory tree, a file, or a symbolic link (never what it points to)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


# renameat2's flag: swap two names atomically (Linux 3.15+, glibc 2.28+).
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(first, second):
    """Swaps the names `first` and `second` atomically; returns False where the system cannot (nothing changed).

    With it, a directory is replaced in one step: a reader, or a process
    killed at any moment, sees the old directory or the new one, never neither.
    """
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if os.name == "posix" else None
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system or kernel without the flag
        return False
    raise OSError(code, f"{os.strerror(code)}: cannot exchange {first} and {second}")
