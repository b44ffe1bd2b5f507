"""Hidden staging directories: a directory is written under one and renamed into place when complete.

A staging directory is named ``.<prefix>tmp-<random>-<host>-<pid>``: unique per
writer, and traceable to its process, so that the next writer removes those of
writers that were killed, and never a live writer's.
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

# Staging directories whose owner cannot be checked (another host, another naming) are
# removed only after this long: no export or preset takes a day.
STALE_STAGING_SECONDS = 24 * 3600
STAGING_NAME = re.compile(r"\.(?P<prefix>.*)tmp-[0-9a-f]+-(?P<host>.+)-(?P<pid>\d+)")


def new_staging(parent, prefix=""):
    """A fresh, empty staging directory in `parent` (created if needed)."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".{prefix}tmp-{secrets.token_hex(4)}-{socket.gethostname()}-{os.getpid()}"
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


def remove_stale_staging(parent, prefix=""):
    """Removes the staging directories with `prefix` in `parent` whose writer was killed; never a live writer's."""
    for staging in Path(parent).glob(f".{glob.escape(prefix)}tmp-*"):
        match = STAGING_NAME.fullmatch(staging.name)
        if match and match["prefix"] != prefix:
            continue
        try:
            # A pid only identifies a process on this host (the directory may be shared
            # storage), and os.kill(pid, 0) would terminate it on Windows.
            if match and match["host"] == socket.gethostname() and os.name == "posix":
                stale = not _pid_alive(int(match["pid"]))
            else:
                stale = time.time() - staging.stat().st_mtime > STALE_STAGING_SECONDS
        except FileNotFoundError:  # removed meanwhile by another writer
            continue
        if stale:
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

