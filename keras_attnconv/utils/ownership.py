"""What marks a directory as written by keras_attnconv, and the rule every owner of one follows.

Each directory the package writes (a run directory, a preset, an export root)
has one owner (`training.run_directory.RunDirectory`, `models.presets`, `export.root.ExportRoot`)
that writes ``.keras_attnconv.json`` into it first: the package, the kind of
directory and the version of its layout. An owner resumes, replaces or adds to
a directory only when it carries the owner's own mark, or when the directory is
absent or empty (then the owner marks it); anything else is a user's, and an
error naming the path and what it holds, raised before any work. Nothing here
deletes a file.

Pure Python: no framework is imported, so the command line checks a
directory before TensorFlow or JAX loads.
"""

import os
from pathlib import Path

from keras_attnconv.utils.files import is_temporary_of, read_json, write_json

MARKER = ".keras_attnconv.json"
PACKAGE = "keras_attnconv"
LAYOUT_VERSION = 1
#: The kinds of directory the package writes, as their marks name them.
KINDS = {
    "run": "a training run directory",
    "preset": "a preset directory",
    "export_root": "an export root",
    "figures": "a figures directory",
}


class ForeignDirectoryError(FileExistsError):
    """A directory the package was asked to write holds what another owner, or the user, put there."""


def mark_of(directory):
    """The kind named by the mark of `directory` (``"run"``, ``"preset"``, ``"export_root"``), or None.

    None where there is no ``.keras_attnconv.json``. Anything else of that
    name must be a valid mark: a file holding a JSON object whose
    ``"package"`` is ``"keras_attnconv"``, ``"kind"`` one of `KINDS` (a
    string) and ``"layout"`` an integer (not a float or a bool) from 1 to
    `LAYOUT_VERSION`. Another one (a folder of that name, a damaged file, a
    layout ``1.0``) is a `ForeignDirectoryError` naming it and what it holds:
    its directory is not the package's to change. A mark of a later layout is
    one too: its directory must not be changed by an older version.
    """
    path = Path(directory) / MARKER
    if not os.path.lexists(path):
        return None
    if not path.is_file():
        raise _invalid(path, "not a file", "a directory" if path.is_dir() else "not a regular file")
    try:
        mark = read_json(path)
    except OSError as error:
        raise _invalid(path, f"unreadable: {error.strerror}", repr(str(path))) from None
    except ValueError as error:
        raise _invalid(path, f"not JSON: {error}", f"text={_shown(path.read_text(errors='replace'))}") from None
    if not isinstance(mark, dict):
        raise _invalid(path, "not a JSON object", f"mark={_shown(mark)}")
    layout, kind = mark.get("layout"), mark.get("kind")
    if mark.get("package") != PACKAGE:
        raise _invalid(path, f'its "package" is not {PACKAGE!r}', f"package={_shown(mark.get('package'))}")
    if type(layout) is not int or layout < 1:  # exactly an int: 1.0 and true are not layouts
        raise _invalid(path, 'its "layout" is not a positive integer', f"layout={_shown(layout)}")
    if layout > LAYOUT_VERSION:
        raise ForeignDirectoryError(
            f"{directory} was written by a later keras_attnconv (layout {layout!r}; this "
            f"version knows {LAYOUT_VERSION}): upgrade the package to use it. "
            f"Received: {str(directory)!r}"
        )
    if not isinstance(kind, str) or kind not in KINDS:
        raise _invalid(path, f'its "kind" is not one of {", ".join(map(repr, KINDS))}', f"kind={_shown(kind)}")
    return kind


def _invalid(path, problem, received):
    """The error for a `MARKER` that is no valid mark: it names the file, what is wrong and what it holds."""
    return ForeignDirectoryError(
        f"{path} is not a valid mark of keras_attnconv ({problem}): its directory is not "
        f"the package's to change; move {MARKER} away if the directory is yours. "
        f"Received: {received}"
    )


def _shown(value, limit=60):
    """`value`'s repr, cut to `limit` characters: what a message shows of what a file holds."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def write_mark(directory, kind):
    """Marks `directory` (created if needed) as a `kind` directory of the package, atomically."""
    if kind not in KINDS:
        raise ValueError(f"`kind` must be one of {', '.join(map(repr, KINDS))}. Received: kind={kind!r}")
    mark_of(directory)  # a mark that is not valid (a folder of its name) is not the package's to replace
    write_json(Path(directory) / MARKER, {"package": PACKAGE, "kind": kind, "layout": LAYOUT_VERSION})


def visible_entries(directory):
    """The names in `directory` (none if it is absent), sorted, without the package's mark (or one being written)."""
    path = Path(directory)
    if not path.is_dir():
        return []
    return sorted(
        entry.name for entry in path.iterdir() if entry.name != MARKER and not is_temporary_of(entry.name, MARKER)
    )


def what_it_holds(directory, limit=5):
    """A short description of a directory that is not the caller's: its mark's kind, or its first entries."""
    kind = mark_of(directory)
    if kind is not None:
        return KINDS[kind]
    entries = visible_entries(directory)
    shown = ", ".join(entries[:limit]) + (f" and {len(entries) - limit} more" if len(entries) > limit else "")
    return f"files without keras_attnconv's mark ({shown})"


def check_owned(directory, kind, argument, adopt=None):
    """Raises `ForeignDirectoryError` unless `directory` may be written as a `kind` directory; changes nothing.

    It may if it is absent, an empty directory, or carries the mark of `kind`
    (a directory with our mark of another kind, e.g. a preset given as a run
    directory, may not). `adopt(directory)` may accept an unmarked one (an
    export root made by TF Serving's user). Returns whether it is marked.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ForeignDirectoryError(
            f"{argument}={str(directory)!r} is a file, not {KINDS[kind]}. Received: {argument}={str(directory)!r}"
        )
    found = mark_of(path)
    if found == kind:
        return True
    if found is None and (not visible_entries(path) or (adopt is not None and adopt(path))):
        return False
    raise ForeignDirectoryError(
        f"{path} holds {what_it_holds(path)}, not {KINDS[kind]} of keras_attnconv; it is "
        f"never changed. Pass another {argument}. Received: {argument}={str(directory)!r}"
    )
