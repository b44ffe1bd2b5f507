"""The export root: its one owner, which alone knows its layout, versions and TF Serving's ``models.config``.

An export root holds:

- ``.keras_attnconv.json``: the mark that makes it an export root of the package
  (`keras_attnconv.utils.ownership`), written with its first export;
- ``<name>/<version>/``: one export each (a SavedModel, ``model.onnx`` or
  ``model.tflite``), written under a hidden staging name in ``<name>/`` and
  renamed onto its number, never overwritten; a model directory holds one format;
- ``models.config`` (SavedModel roots): TF Serving's ``--model_config_file``,
  read and written as its ``ModelServerConfig`` message (`config_file`) and
  merged: entries, policies, labels and fields the package did not write are
  kept as they were, and an entry serving a folder other than this root's
  model directory of its name is the user's, never changed;
- ``.models.config.lock``: held while ``models.config`` is merged.

The package exports into a root that is absent, empty, carries its mark, or
is a TF Serving model root of the user's, recognised by what TF Serving reads
(``models.config``, and model directories whose numbered versions hold an
export; folder names alone never make one): then it adds its own model
directories and entries and changes nothing else. A run directory, a preset
or a user's folder is an error naming it, before any work.
"""

import errno
import json
import os
import posixpath
import re
from pathlib import Path

from keras_attnconv.export import config_file
from keras_attnconv.utils.checks import check_choice, check_path, did_you_mean
from keras_attnconv.utils.files import check_writable, file_lock
from keras_attnconv.utils.ownership import check_owned, mark_of, write_mark
from keras_attnconv.utils.staging import new_staging, remove_stale_staging

FORMATS = ("saved_model", "onnx", "litert")
#: The export root of each format when none is given.
DEFAULT_EXPORT_DIRS = {"saved_model": "saved_models", "onnx": "onnx_models", "litert": "litert_models"}
#: The file that makes a version directory a version of each format.
VERSION_FILES = {"saved_model": "saved_model.pb", "onnx": "model.onnx", "litert": "model.tflite"}
#: The files that make a numbered directory an export, to TF Serving (its text SavedModel too) or the package.
EXPORT_FILES = (*VERSION_FILES.values(), "saved_model.pbtxt")
#: Where a version says what it is: which model, exported by which package (TF Serving ignores assets.extra/).
METADATA_FILES = {"saved_model": "assets.extra/metadata.json", "onnx": "metadata.json", "litert": "metadata.json"}
MODELS_CONFIG = "models.config"
#: A model's directory (and TF Serving) name: a plain name, never a path, never hidden.
SERVING_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: Names a model directory cannot take: the root's own files.
RESERVED_NAMES = (MODELS_CONFIG,)
#: TF Serving's versions are int64.
MAX_VERSION = 2**63 - 1


def check_serving_name(name, argument="serving_name"):
    """Raises ValueError unless `name` is a plain directory name that is not one of the root's own files."""
    if not isinstance(name, str) or not SERVING_NAME.fullmatch(name) or len(name) > 200:
        raise ValueError(
            f"`{argument}` must be a name of letters, digits, '_', '-' and '.', starting with a letter "
            f"or digit (never a path). Received: {argument}={name!r}"
        )
    if name in RESERVED_NAMES:
        raise ValueError(
            f"`{argument}` cannot be {name!r}: the export root's own file has that name. Received: {argument}={name!r}"
        )
    return name


def check_version(version, allow_none=True):
    """Raises ValueError unless `version` is a TF Serving version, 1 to 2**63 - 1 (or None, the next free one)."""
    if version is None and allow_none:
        return
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        expected = "None or an integer" if allow_none else "an integer"
        raise ValueError(
            f"`version` must be {expected} from 1 to 2**63 - 1 (TF Serving's int64). Received: version={version!r}"
        )


def _is_version_dir(path):
    # ASCII digits only: str.isdigit() also takes '²' or '٣', which int() refuses or TF Serving would not read.
    return path.is_dir() and path.name.isascii() and path.name.isdigit()


def _is_model_dir(path):
    """Whether `path` is a model directory as TF Serving reads one: a plain name holding numbered versions only
    (and hidden staging), at least one of them an export (`EXPORT_FILES`)."""
    if not (path.is_dir() and SERVING_NAME.fullmatch(path.name)):
        return False
    versions = [entry for entry in path.iterdir() if not entry.name.startswith(".")]
    return all(_is_version_dir(v) for v in versions) and any(
        (v / file).is_file() for v in versions for file in EXPORT_FILES
    )


class ExportRoot:
    """One export root of one format: its model directories, versions and ``models.config``.

    Args:
        export_dir: the root; None is the format's default (`DEFAULT_EXPORT_DIRS`).
        format: ``"saved_model"``, ``"onnx"`` or ``"litert"``.
    """

    KIND = "export_root"
    LOCK = f".{MODELS_CONFIG}.lock"

    def __init__(self, export_dir=None, format="saved_model"):
        check_choice("format", format, FORMATS)
        self.format = format
        self.path = Path(DEFAULT_EXPORT_DIRS[format] if export_dir is None else check_path("export_dir", export_dir))

    def __repr__(self):
        return f"ExportRoot({str(self.path)!r}, format={self.format!r})"

    @property
    def models_config(self):
        return self.path / MODELS_CONFIG

    def model_dir(self, name):
        return self.path / check_serving_name(name, "name")

    def check(self, name=None, base_path="/models", *, models_config=True):
        """Raises, naming the path, unless an export of `name` could be published here; writes nothing.

        The root (and the model's directory) must be writable and the root the
        package's or a TF Serving root of the user's (`ownership.check_owned`);
        a SavedModel root's ``models.config`` must be TF Serving's (and, a link,
        have a writable target), and its entry of `name`, if any, this root's
        (`serves_this_root`); the model's directory must hold this format only.
        ``models_config=False`` leaves ``models.config`` unread: TF Serving's
        protos read it, which a machine without TensorFlow lacks.
        """
        check_writable(self.path, "export_dir")
        check_owned(self.path, self.KIND, "export_dir", adopt=self._is_model_root)
        if self.format == "saved_model" and models_config:
            config = self.read_models_config()
            if self.models_config.is_symlink():  # written through the link: where it points must be writable
                check_writable(self.models_config.resolve(), "models_config", file=True)
            if name is not None:
                self._check_users_entry(self._entry(config, name), base_path, f"name={name!r}")
        if name is not None:
            model_dir = self.model_dir(name)
            check_writable(model_dir, "export_dir")
            self._check_one_format(model_dir)

    def _is_model_root(self, path):
        """Whether an unmarked directory is a TF Serving model root, by what TF Serving reads in it.

        It holds ``models.config`` (read next: one TF Serving cannot read is an
        error naming it) and model directories (`_is_model_dir`), and nothing
        else: what earlier versions of the package and TF Serving's users make.
        Numbered folders alone (``photos/2023/01/``) are a user's folder.
        """
        entries = [entry for entry in path.iterdir() if not entry.name.startswith(".")]
        return bool(entries) and all(entry.name == MODELS_CONFIG or _is_model_dir(entry) for entry in entries)

    def _check_one_format(self, model_dir):
        """A model directory holds versions of one format: a server of one must not meet the other."""
        if not model_dir.is_dir():
            return
        for other in FORMATS:
            if other != self.format and self.versions(model_dir.name, other):
                raise ValueError(
                    f"{model_dir} holds {other} versions: export {self.format} to another export_dir "
                    f"(default {DEFAULT_EXPORT_DIRS[self.format]!r}). Received: format={self.format!r}"
                )

    def model_names(self):
        """The names of the root's model directories, sorted."""
        if not self.path.is_dir():
            return []
        return sorted(p.name for p in self.path.iterdir() if p.is_dir() and SERVING_NAME.fullmatch(p.name))

    def versions(self, name, format=None):
        """The versions of `name` that hold an export of `format` (default: the root's), ascending."""
        model_dir = self.path / name
        if not model_dir.is_dir():
            return []
        version_file = VERSION_FILES[format or self.format]
        return sorted(int(p.name) for p in model_dir.iterdir() if _is_version_dir(p) and (p / version_file).exists())

    def _metadata(self, name, version):
        """What version `version` of `name` says it is (its metadata.json), or {} where it says nothing readable."""
        try:
            metadata = json.loads((self.path / name / str(version) / METADATA_FILES[self.format]).read_text())
        except (OSError, ValueError):
            return {}
        return metadata if isinstance(metadata, dict) else {}

    def exported_by_the_package(self, name):
        """Whether a version of `name` was exported by keras_attnconv (its metadata says so)."""
        return any("keras_attnconv_version" in self._metadata(name, version) for version in self.versions(name))

    def version_exported_from(self, name, source_digest):
        """The version directory of `name` whose metadata records `source_digest` (what it was exported from).

        None if there is none: how a command run again after a kill finds the
        export it already published instead of publishing it again.
        """
        for version in self.versions(name):
            if self._metadata(name, version).get("source_digest") == source_digest:
                return self.path / name / str(version)
        return None

    def check_same_answers(self, name, preprocessing):
        """Raises ValueError unless a new version of `name` takes the input and gives the classes of its versions.

        A client of TF Serving (or of an export root of ONNX or LiteRT files)
        asks a model by its name, and any of its versions may answer: a
        version of other classes (a fine-tuned model, a model trained on
        another dataset) or of another input would answer it otherwise. Such a
        model is exported under a name of its own. `preprocessing` is the new
        model's (`ImageClassifier.preprocessing`); a version that records none
        (not the package's) is not compared, and its normalisation may differ,
        as it is inside the exported graph.
        """
        new = json.loads(json.dumps(preprocessing))  # as metadata.json holds it: lists, not tuples
        for version in self.versions(name):
            recorded = self._metadata(name, version).get("preprocessing")
            if not isinstance(recorded, dict):
                continue
            for field, what in (("class_names", "classes"), ("input", "input")):
                if recorded.get(field) != new[field]:
                    raise ValueError(
                        f"{self.path / name} holds version {version}, whose {what} ({_abridged(recorded.get(field))}) "
                        f"are not this model's ({_abridged(new[field])}): a client asks {name!r} by its name, and any "
                        f"of its versions may answer, so one name serves one input and one set of classes. Export "
                        f"this model under a name of its own: attnconv train --export-name NAME (export_name=), "
                        f"attnconv export SOURCE --name NAME (serving_name=), or another export root. "
                        f"Received: name={name!r}"
                    )

    def next_version(self, name):
        """1 + the largest numbered directory of `name`, complete or not (1 if none)."""
        model_dir = self.path / name
        numbers = [int(p.name) for p in model_dir.iterdir() if _is_version_dir(p)] if model_dir.is_dir() else []
        return max(numbers, default=0) + 1

    def check_new_version(self, name, version):
        """Raises before any work unless `version` (None: the next free one) can be published for `name`."""
        check_version(version)
        if version is None:
            check_version(self.next_version(name), allow_none=False)
        elif (self.path / name / str(version)).exists():
            raise self._version_exists(self.path / name / str(version), version)

    @staticmethod
    def _version_exists(target, version):
        return FileExistsError(
            f"{target} exists: versions are never overwritten. Pass another `version`, "
            f"or version=None for the next free one. Received: version={version}"
        )

    def claim(self):
        """Creates and marks the root (a root of the user's is marked too, and nothing of it changed)."""
        self.check()
        if mark_of(self.path) != self.KIND:
            write_mark(self.path, self.KIND)

    def new_staging(self, name):
        """A fresh hidden staging directory in the model's directory; those of killed exports are removed first."""
        model_dir = self.model_dir(name)
        remove_stale_staging(model_dir)
        return new_staging(model_dir)

    def publish(self, staging, name, version, write_metadata):
        """Renames the complete `staging` directory onto its version number; returns the version directory.

        ``write_metadata(staging, version)`` runs before each try (the metadata
        names the version). The rename is the atomic claim of the number: when
        two exports pick the same next version, the second rename fails (the
        first one's directory is not empty) and, with ``version=None``, moves on.
        """
        candidate = self.next_version(name) if version is None else version
        while True:
            check_version(candidate, allow_none=False)
            target = self.path / name / str(candidate)
            write_metadata(staging, candidate)
            try:
                os.rename(staging, target)  # atomic: a server sees all of the version or none of it
                return target
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                    raise
                if version is not None:
                    raise self._version_exists(target, version) from None
                candidate += 1

    def read_models_config(self):
        """The root's ``models.config`` as TF Serving's ``ModelServerConfig`` (empty if there is none)."""
        return config_file.read(self.models_config, self.path)[1]

    @staticmethod
    def _entry(config, name):
        return next((entry for entry in config.model_config_list.config if entry.name == name), None)

    def serves_this_root(self, entry, base_path="/models"):
        """Whether a ``models.config`` entry serves this root's model directory of its name: the package's to change.

        Its base path is that directory as the package writes it (`base_path`,
        where TF Serving finds the root) or as this machine names it. Any other
        is a folder elsewhere, and the entry the user's.
        """
        local = self.path / entry.name
        ours = {posixpath.normpath(f"{base_path}/{entry.name}"), str(local.absolute()), str(local.resolve())}
        return bool(entry.base_path) and posixpath.normpath(entry.base_path) in ours

    def _check_users_entry(self, entry, base_path, received):
        """Raises, naming it, if `entry` (None: no entry) serves a folder elsewhere: an export that needs it stops."""
        if entry is not None and not self.serves_this_root(entry, base_path):
            raise ValueError(
                f"{self.models_config}: its entry {entry.name!r} serves {entry.base_path}, not "
                f"{posixpath.join(base_path, entry.name)} (this export root's), so it is the user's and "
                f"never changed: export under another name (--name), or edit the entry. "
                f"Received: {received}"
            )

    def _check_labels(self, entry, version):
        """Raises, naming the label, if serving only `version` (None: a new one) would leave a label of `entry` on
        a version TF Serving no longer serves, which it refuses: the labels are the user's to move."""
        stranded = sorted((label, labelled) for label, labelled in entry.version_labels.items() if labelled != version)
        if stranded:
            label, labelled = stranded[0]
            serving = "a new version" if version is None else f"version {version}"
            raise ValueError(
                f"{self.models_config}: its entry {entry.name!r} has the label {label!r} on version "
                f"{labelled}, which serving only {serving} would leave unserved (TF Serving refuses a "
                f"label on a version it does not serve): move or remove the label there first. "
                f"Received: name={entry.name!r}, version={version!r}"
            )

    def check_serve(self, name, version=None, base_path="/models"):
        """Raises, naming the entry or label, unless ``models.config`` may serve only `version` (None: a new one)
        of `name`: its entry, if any, is this root's, and no label of it names another version. Writes nothing."""
        self._check_servable(self._entry(self.read_models_config(), name), version, base_path)

    def _check_servable(self, entry, version, base_path):
        if entry is not None:
            self._check_users_entry(entry, base_path, f"name={entry.name!r}, version={version!r}")
            self._check_labels(entry, version)

    def served_version(self, name):
        """The version of `name` that ``models.config`` serves (its largest specific one), or None."""
        for entry in self.read_models_config().model_config_list.config:
            if entry.name == name and entry.model_version_policy.WhichOneof("policy_choice") == "specific":
                return max(entry.model_version_policy.specific.versions, default=None)
        return None

    def update_models_config(self, serve=None, base_path="/models"):
        """Merges the root's SavedModels into ``models.config``; returns its path.

        A model of the package new to the file gets an entry serving its first
        version (never its newest: a new version is served only when asked);
        a model directory of the user's gets none. `serve`
        ({name: version}) makes those entries serve those versions, unless
        one is the user's or a label of it would be left on a version no
        longer served (`check_serve`: an error, nothing written). An entry
        that serves versions no longer on disk keeps those that are, else
        serves the newest (TF Serving cannot load a missing version). An entry
        serving a folder elsewhere, and every other field, policy and label,
        stays as it was. The file is replaced atomically (through a link, the
        file it points to), under a lock, so concurrent exports never lose an
        entry; its header comments are kept (`config_file.write`).
        """
        serve = dict(serve or {})
        for name, version in serve.items():
            check_version(version, allow_none=False)
            if version not in self.versions(check_serving_name(name, "name"), "saved_model"):
                hint = "" if (self.path / name).is_dir() else did_you_mean(name, self.model_names())
                raise FileNotFoundError(
                    f"{self.path / name / str(version)} holds no SavedModel to serve.{hint} "
                    f"Received: name={name!r}, version={version!r}"
                )
        path = self.models_config
        with file_lock(self.path / self.LOCK):  # write_atomically removes killed writers' temporaries, by name
            text, config = config_file.read(path, self.path)
            entries = {entry.name: entry for entry in config.model_config_list.config}
            for name, version in serve.items():  # (checked before the export too; the file may have changed since)
                self._check_servable(entries.get(name), version, base_path)
            for model_name in self.model_names():
                versions = self.versions(model_name, "saved_model")
                if not versions:
                    continue
                entry = entries.get(model_name)
                if entry is None and not self.exported_by_the_package(model_name):
                    continue  # the user's model, which the user chose not to serve here
                if entry is not None and not self.serves_this_root(entry, base_path):
                    continue  # the user's entry, serving a folder elsewhere: never changed
                if entry is None:
                    entry = config.model_config_list.config.add(
                        name=model_name, model_platform="tensorflow", base_path=f"{base_path}/{model_name}"
                    )
                    entry.model_version_policy.specific.versions.append(versions[0])
                    entries[model_name] = entry
                elif entry.model_version_policy.WhichOneof("policy_choice") == "specific":
                    served = entry.model_version_policy.specific.versions
                    if any(v not in versions for v in served):
                        served[:] = [v for v in served if v in versions] or [versions[-1]]
                if model_name in serve:
                    entry.model_version_policy.specific.versions[:] = [serve[model_name]]
            config_file.write(path, config, text)
        return path


def _abridged(value, limit=6):
    """`value` for an error message: a long list of class names as its first few, and how many there are."""
    if isinstance(value, list) and len(value) > limit:
        return f"{', '.join(map(str, value[:limit]))}, ... ({len(value)} in all)"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return json.dumps(value)
