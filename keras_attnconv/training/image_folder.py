"""A folder of images as a dataset: one subfolder per class, the layout of ``keras.utils.image_dataset_from_directory``.

``DIR/<split>/<class>/<image>`` (the splits are ``DIR``'s folders that hold class folders: ``train``, ``test``,
``validation``, ...; every split has the same classes), or ``DIR/<class>/<image>``, which is split here
(`held_out`: `HELD_OUT_FRACTION` of each class goes to ``"test"``, the images ranked by a digest of their path
and `SPLIT_SEED`: the same split every time, and adding an image moves few others). The class names are the class
folders' names, sorted; a label is its class' index. Images are JPEG or PNG (``.jpg``, ``.jpeg``, ``.png``, any
case; in a class folder or below it), decoded by Pillow and converted to RGB, all of one square size; anything
else (hidden entries, other files, folders that are no split or class) is skipped, and the count said on stderr.

Decoded once, in parallel for many images, the pixels and their training statistics are cached in
`cache_directory` (never in the user's folder), one .npz per folder and content (the path, size and mtime of
every image), so a changed folder is decoded again; within one process the scan is kept too, while the folder's
directories list the same names (a file rewritten under its name is seen by the next process). NumPy and Pillow
only: no TensorFlow.
"""

import concurrent.futures
import dataclasses
import functools
import hashlib
import multiprocessing
import os
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np

from keras_attnconv.training.data import DatasetInfo, _channel_statistics, missing_split
from keras_attnconv.training.held_out import HELD_OUT_FRACTION, SPLIT_SEED, held_out_mask
from keras_attnconv.utils.files import write_atomically
from keras_attnconv.utils.reports import usable_cpus

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
SPLIT_NAMES = ("train", "test", "validation")  # a folder of these holding folders: DIR is split by folders
CACHE_FORMAT = 2  # part of the cache key: a new format, split rule or decoding (2: 16-bit grey PNGs) decodes again
PARALLEL_FROM = 2_000  # images; fewer are decoded in this process
CHUNK = 500  # images per task of the decoding pool


def cache_directory():
    """Where decoded folders are cached: ``$KERAS_ATTNCONV_CACHE/image_folders``, else
    ``$XDG_CACHE_HOME/keras_attnconv/image_folders``, else ``~/.cache/keras_attnconv/image_folders``."""
    root = (
        os.environ.get("KERAS_ATTNCONV_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "keras_attnconv"
    )
    return Path(root).expanduser() / "image_folders"


def check_exists(name):
    """Raises FileNotFoundError for a name that is a path (it has a separator, or starts with ``~`` or ``.``)
    to nothing: a folder (or a file) that is not there, rather than an unknown dataset name."""
    text = str(name)
    if (os.sep in text or "/" in text or text.startswith(("~", "."))) and not Path(text).expanduser().exists():
        raise FileNotFoundError(
            f"No image folder (or .npz file) at {str(Path(text).expanduser())!r}. Received: dataset={text!r}"
        )


@dataclasses.dataclass(frozen=True, eq=False)  # compared by identity: the key of the decoded arrays' cache
class _Scan:
    name: str
    root: Path  # resolved
    class_names: tuple
    splits: dict  # {split: ((path relative to root, label), ...)}, in a fixed order
    key: str  # digest of the content: every image's path, size and mtime, and the split rule
    directories: tuple  # ((path, sorted names), ...) of every directory read: while they list the same, it stands


_SCANS = {}  # resolved root -> the latest _Scan of it


def folder_info(name):
    """`DatasetInfo` of the image folder `name`: classes, training statistics, size; eval split "test" (else
    "validation", where the folder has that split and no "test")."""
    scan = _current_scan(name)
    data = _decoded(scan)
    eval_split = next((s for s in ("test", "validation") if s in scan.splits), "test")
    mean, std = (tuple(data["mean"].tolist()), tuple(data["std"].tolist())) if data["mean"].size else (None, None)
    return DatasetInfo(
        str(name), len(scan.class_names), scan.class_names, mean, std, eval_split, int(data["image_size"])
    )


def folder_arrays(name, split, argument="split"):
    """(uint8 images NHWC, read-only; int64 labels) of one split of the image folder `name`.

    ``argument``: what the caller's user calls the split, for the error of a split the folder lacks.
    """
    scan = _current_scan(name)
    if split not in scan.splits:
        raise missing_split(name, split, scan.splits, argument)
    data = _decoded(scan)
    return data[f"x_{split}"], data[f"y_{split}"].copy()


def _current_scan(name):
    root = Path(str(name)).expanduser().resolve()
    scan = _SCANS.get(root)
    if scan is None or any(_listing(path) != names for path, names in scan.directories):
        while len(_SCANS) >= 8:
            del _SCANS[next(iter(_SCANS))]
        scan = _SCANS[root] = _scan(str(name), root)
    return scan


def _listing(path):
    try:
        return tuple(sorted(os.listdir(path)))
    except OSError:
        return None


def _scan(name, root):
    """Reads the folder's layout (no image is opened): classes, splits, and the digest of its content."""
    directories, skipped, shown = [], [], Path(name).expanduser()
    tops = _folders(root, directories, skipped)
    by_split = any(_folders(top, [], []) for top in tops if top.name in SPLIT_NAMES)
    classes = {"": tops}
    if by_split:  # the folders that hold folders are the splits; any other is skipped
        classes = {}
        for top in tops:
            inside = []
            classes[top.name] = _folders(top, directories, inside)
            skipped += inside if classes[top.name] else [str(top)]
        classes = {split: found for split, found in classes.items() if found}
    names = {split: [folder.name for folder in found] for split, found in classes.items()}
    class_names = tuple(sorted(set().union(*names.values())))
    if not class_names:
        raise ValueError(
            f"{str(shown)!r} holds no class folders: an image folder is DIR/<class>/<images> or "
            f"DIR/<split>/<class>/<images> (JPEG or PNG). Received: dataset={name!r}"
        )
    for split, found in names.items():
        if found != list(class_names):
            missing = next(c for c in class_names if c not in found)
            has = next(s for s in names if missing in names[s])
            raise ValueError(
                f"The class {missing!r} of {str(shown)!r} is in its split {has!r} but not in {split!r}: "
                f"every split needs the same class folders. Received: {split} classes {found}"
            )
    if len(class_names) < 2:
        raise ValueError(f"{str(shown)!r} needs at least 2 class folders. Received: classes {list(class_names)}")
    files = {}  # split -> [(relative path, label, stat)]
    for split, found in classes.items():
        for folder in found:
            images = _images_under(folder, directories, skipped, root, set())
            if not images:
                raise ValueError(
                    f"The class folder {str(shown / folder.relative_to(root))!r} holds no JPEG or PNG "
                    f"images. Received: dataset={name!r}"
                )
            label = class_names.index(folder.name)
            files.setdefault(split, []).extend([(path, label, stat) for path, stat in images])
    if not by_split:
        files = _held_out(files[""])
    if skipped:
        print(
            f"keras_attnconv: skipped {len(skipped)} files or folders under {str(shown)!r} that are not JPEG/PNG "
            f"images in a class folder (hidden, another extension, or outside the class folders), e.g. "
            f"{os.path.relpath(skipped[0], root)!r}",
            file=sys.stderr,
        )
    content = [
        f"{split}\0{path}\0{label}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
        for split, entries in files.items()
        for path, label, stat in entries
    ]
    digest = hashlib.sha256(f"{CACHE_FORMAT}\0{HELD_OUT_FRACTION}\0{SPLIT_SEED}\n{''.join(content)}".encode())
    splits = {split: tuple((path, label) for path, label, _ in entries) for split, entries in files.items()}
    return _Scan(name, root, class_names, splits, digest.hexdigest(), tuple(directories))


def _entries(directory, directories, skipped):
    """(folders, image files) of `directory` as sorted DirEntry lists; the rest goes to `skipped` (full paths)."""
    with os.scandir(directory) as found:
        found = sorted(found, key=lambda e: e.name)
    directories.append((str(directory), tuple(entry.name for entry in found)))
    folders, images = [], []
    for entry in found:
        if entry.name.startswith("."):
            skipped.append(entry.path)
        elif entry.is_dir():
            folders.append(entry)
        elif entry.is_file() and entry.name.lower().endswith(IMAGE_EXTENSIONS):
            images.append(entry)
        else:
            skipped.append(entry.path)
    return folders, images


def _folders(directory, directories, skipped):
    """The (non-hidden) folders of `directory` as Paths; its files go to `skipped`."""
    folders, images = _entries(directory, directories, skipped)
    skipped += [entry.path for entry in images]
    return [Path(entry.path) for entry in folders]


def _images_under(folder, directories, skipped, root, seen):
    """[(relative posix path, stat)] of the images in `folder` and the folders below it (links followed once)."""
    real = os.path.realpath(folder)
    if real in seen:
        return []
    seen.add(real)
    folders, images = _entries(folder, directories, skipped)
    start = len(os.path.join(root, ""))  # relative paths by slicing: pathlib costs seconds for 60,000 files
    found = [(entry.path[start:].replace(os.sep, "/"), entry.stat()) for entry in images]
    for entry in folders:
        found += _images_under(Path(entry.path), directories, skipped, root, seen)
    return found


def _held_out(entries):
    """{"train": ..., "test": ...} of a folder without splits (`held_out_mask`, keyed by path), class by class."""
    held = held_out_mask([path for path, _, _ in entries], [label for _, label, _ in entries])
    train, test = [], []
    for index in sorted(range(len(entries)), key=lambda i: entries[i][1]):  # stable: a class' images in order
        (test if held[index] else train).append(entries[index])
    return {"train": train, "test": test}


@functools.lru_cache(maxsize=2)  # dataset_info and two load_arrays decode or read the cache once
def _decoded(scan):
    """{"x_<split>", "y_<split>", "mean", "std", "image_size"} of a scan: from the cache, else decoded and cached."""
    path = cache_directory() / f"{hashlib.sha256(str(scan.root).encode()).hexdigest()[:16]}-{scan.key[:32]}.npz"
    data = _read_cache(path, scan)
    if data is None:
        data = _decode(scan)
        _write_cache(path, scan, data)
    for value in data.values():
        value.setflags(write=False)  # shared by every caller
    return data


def _read_cache(path, scan):
    """The cached arrays of `scan` at `path`, or None where the file is absent, unreadable or not this content's."""
    try:
        with np.load(path, allow_pickle=False) as cached:
            data = {key: cached[key] for key in cached.files}
        size = int(data["image_size"])
        fits = str(data.pop("key")) == scan.key and len(data) == 2 * len(scan.splits) + 3
        for split, entries in scan.splits.items():
            images, labels = data[f"x_{split}"], data[f"y_{split}"]
            fits = fits and images.dtype == np.uint8 and images.shape == (len(entries), size, size, 3)
            fits = fits and labels.tolist() == [label for _, label in entries]
        return data if fits else None
    except (OSError, ValueError, TypeError, KeyError, EOFError, zipfile.BadZipFile, zlib.error):
        return None


def _write_cache(path, scan, data):
    """Writes the cache file atomically and removes this folder's older ones; a failure only costs a decode."""
    if scan.root == path.parent.resolve() or scan.root in path.parent.resolve().parents:
        print(
            f"keras_attnconv: not caching the decoded images of {scan.name!r}: the cache {str(path.parent)!r} "
            f"is inside it (set KERAS_ATTNCONV_CACHE elsewhere)",
            file=sys.stderr,
        )
        return
    try:
        write_atomically(path, lambda tmp: np.savez(tmp, key=np.array(scan.key), **data))
        for old in path.parent.glob(f"{path.name.split('-')[0]}-*.npz"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError as error:
        print(
            f"keras_attnconv: could not cache the decoded images of {scan.name!r} in {str(path.parent)!r} "
            f"({error}); they will be decoded again next time",
            file=sys.stderr,
        )


def _decode(scan):
    """Decodes every image of `scan` (train first: its first image sets the size) and the training statistics."""
    order = sorted(scan.splits, key=lambda split: split != "train")
    shown = Path(scan.name).expanduser()  # the folder as the user named it, in messages
    paths = [os.path.join(shown, path) for split in order for path, _ in scan.splits[split]]
    images = _decode_all(paths, scan.name)
    height, width = images[0].shape[:2]
    if height != width:
        raise ValueError(
            f"The images of {str(shown)!r} must be square (HxH) for a model, resized or cropped "
            f"beforehand: {paths[0]!r} is {height}x{width} (height x width). Received: dataset={scan.name!r}"
        )
    for path, image in zip(paths, images):
        if image.shape[:2] != (height, width):
            raise ValueError(
                f"{path!r} is {image.shape[0]}x{image.shape[1]} (height x width), but the training images "
                f"are {height}x{width} (as {paths[0]!r}): every image of a folder must have that size; "
                f"resize them beforehand. Received: dataset={scan.name!r}"
            )
    data, start = {}, 0
    for split in order:
        count = len(scan.splits[split])
        data[f"x_{split}"] = (
            np.stack(images[start : start + count]) if count else np.zeros((0, height, width, 3), np.uint8)
        )
        data[f"y_{split}"] = np.array([label for _, label in scan.splits[split]], np.int64)
        start += count
    mean, std = _channel_statistics(data["x_train"]) if "x_train" in data else (None, None)
    data["mean"], data["std"] = np.array(mean or (), np.float64), np.array(std or (), np.float64)
    data["image_size"] = np.array(height)
    return data


def _decode_all(paths, name):
    """Every image at `paths` as a uint8 RGB array, in parallel for `PARALLEL_FROM` images or more.

    Processes forked where that is the system's way (Linux: a 32x32 JPEG costs more Python than decoding,
    which threads would serialise), threads elsewhere (Pillow decodes outside the GIL).
    """
    from PIL import Image

    Image.preinit()  # the JPEG and PNG plugins, imported before any fork
    workers = min(usable_cpus() or 1, 16)
    if len(paths) < PARALLEL_FROM or workers < 2:
        return _decode_chunk(paths, name)
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    else:
        pool = concurrent.futures.ThreadPoolExecutor(workers)
    chunks = [paths[i : i + CHUNK] for i in range(0, len(paths), CHUNK)]
    try:
        return [image for chunk in pool.map(_decode_chunk, chunks, [name] * len(chunks)) for image in chunk]
    finally:
        pool.shutdown(cancel_futures=True)


#: Pillow's modes of a 16-bit greyscale PNG (``I`` in its earlier versions): its ``convert("RGB")`` clips them at
#: 255 instead of scaling them, which made such an image white.
SIXTEEN_BIT_GREY_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def _rgb_pixels(image):
    """A Pillow image as (H, W, 3) uint8 RGB, its alpha dropped: 16-bit grey scaled to 8 bits (v / 257, rounded,
    as libpng strips it)."""
    if image.mode in SIXTEEN_BIT_GREY_MODES:
        grey = np.rint(np.asarray(image, dtype=np.float64) / 257).clip(0, 255).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=-1)
    if image.mode == "P" and "transparency" in image.info:  # through RGBA, as Pillow asks (else it warns)
        image = image.convert("RGBA")
    return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))


def _decode_chunk(paths, name):
    """The images at `paths` (uint8 RGB arrays); one Pillow cannot read as JPEG or PNG is a ValueError naming it."""
    from PIL import Image

    images = []
    for path in paths:
        try:
            with Image.open(path, formats=("JPEG", "PNG")) as image:
                images.append(_rgb_pixels(image))
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
            raise ValueError(
                f"{path!r} cannot be read as a JPEG or PNG image ({type(error).__name__}: {error}). "
                f"Received: dataset={name!r}"
            ) from None
    return images
