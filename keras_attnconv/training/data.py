"""Datasets for training and evaluation: CIFAR-10/100 (tfds), the embedded sample, local .npz, image folders.

`load_dataset` returns a batched ``tf.data.Dataset`` of ``(uint8 images, int
labels)`` ready for ``model.fit`` (every model of the zoo normalises its input
itself, with the statistics of its config, which `DatasetInfo` gives).
`load_arrays` returns the raw uint8 images as NumPy arrays and needs no
TensorFlow for the embedded sample and local files (the GPU machine has none).
TensorFlow and tfds are imported inside the functions that need them; a folder
of images is read by `keras_attnconv.training.image_folder`.
"""

import contextlib
import dataclasses
import functools
import zipfile
import zlib
from pathlib import Path

import numpy as np

from keras_attnconv.models.cifar import (
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    OFFICIAL_MEAN,
    OFFICIAL_STD,
)
from keras_attnconv.training import held_out
from keras_attnconv.training.recipe import NORMALIZATIONS
from keras_attnconv.utils.assets import SAMPLE_PATH
from keras_attnconv.utils.checks import check_choice, did_you_mean

TFDS_DATASETS = ("cifar10", "cifar100")
DATASETS = (*TFDS_DATASETS, "cifar10_sample")
PAD = 4  # pixels of zero padding before the random crop
MAX_LABEL = 2**31  # class numbers beyond this are no labels (and beyond 2**63 they would wrap in int64)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model and an export need to know about a dataset."""

    name: str
    num_classes: int
    class_names: tuple
    mean: "tuple | None"  # per channel, of pixels / 255, over the training split (None: a .npz without one)
    std: "tuple | None"
    eval_split: str
    image_size: int = 32


def dataset_info(dataset):
    """`DatasetInfo` of a dataset: a name, a local .npz path or a folder of images (`image_folder`).

    The statistics (`DatasetInfo.mean`, `.std`) are those of the training split, per channel, of pixels / 255:
    CIFAR-10's and CIFAR-100's published ones; for the embedded sample and a .npz, computed from their
    training split (``x_train``, else ``x``) once per file (a file rewritten since is read again); None for
    a .npz without one.
    """
    if dataset == "cifar100":
        names = tuple(str(i) for i in range(100))
        return DatasetInfo(dataset, 100, names, CIFAR100_MEAN, CIFAR100_STD, "test")
    if dataset == "cifar10":
        return DatasetInfo(dataset, 10, CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD, "test")
    if dataset == "cifar10_sample":
        sample = _npz_info(dataset, SAMPLE_PATH)
        return dataclasses.replace(sample, class_names=CIFAR10_CLASSES, eval_split="validation")
    if Path(str(dataset)).expanduser().is_dir():
        from keras_attnconv.training import image_folder

        return image_folder.folder_info(dataset)
    if str(dataset).endswith(".npz"):
        return _npz_info(dataset, _existing_npz(dataset))
    from keras_attnconv.training.image_folder import check_exists

    check_exists(dataset)  # a path to nothing: FileNotFoundError
    raise ValueError(_unknown_dataset_message(dataset))


def _npz_info(name, path):
    stat = Path(path).stat()
    return _read_npz_info(str(name), str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_npz_info(name, path, mtime_ns, size):
    """`DatasetInfo` of the .npz at `path`; cached by the file's (path, mtime, size): read once, not per split."""
    with _open_npz(name, path) as data:
        splits = _npz_splits(name, data.files)
        labels = np.concatenate(
            [_integer_labels(name, split, _npz_array(name, data, y)) for split, (_, y) in splits.items()]
        )
        train = splits.get("train", splits.get(""))
        images_key = (train or next(iter(splits.values())))[0]
        images = _check_images(name, images_key, _npz_array(name, data, images_key))
        if set(splits) == {""} and len(images) == len(labels):  # x/y alone: the images it trains on, not those
            # held out (a file with another number of labels is refused when its arrays are loaded)
            images = images[~_held_out_of(labels)]
        mean, std = _channel_statistics(images) if train else (None, None)
        stated = _class_names(name, _npz_array(name, data, "class_names")) if "class_names" in data.files else None
    num_classes = len(stated) if stated else int(labels.max(initial=0)) + 1
    if num_classes < 2:
        raise ValueError(
            f"{name!r} needs labels of at least 2 classes (integers 0 .. classes-1), or a "
            f"`class_names` array. Received: labels {sorted(set(labels.tolist()))}"
        )
    names = (
        tuple(stated)
        if stated
        else (CIFAR10_CLASSES if num_classes == 10 else tuple(str(i) for i in range(num_classes)))
    )
    return DatasetInfo(name, num_classes, names, mean, std, "test", images.shape[1])


def _class_names(name, names):
    """The `class_names` array of a .npz as strings: one name per class, a 1-D array of text."""
    if names.ndim != 1 or names.dtype.kind not in "US" or not names.size:
        raise ValueError(
            f"The array 'class_names' of {str(name)!r} must hold one name per class, a 1-D array of "
            f"strings. Received: class_names {names.dtype} {names.shape}"
        )
    return [str(n) for n in names]


def _channel_statistics(images):
    """Per-channel ``(mean, std)`` of ``images / 255`` (uint8 NHWC), (None, None) for no images.

    Exact, from each channel's 256-bin histogram: no float copy of the images (CIFAR's 50,000 in float64: 1.2 GB).
    """
    if not images.size:
        return None, None
    values = np.arange(256) / 255
    counts = np.stack([np.bincount(images[..., c].ravel(), minlength=256) for c in range(images.shape[-1])])
    mean = counts @ values / counts.sum(axis=1)
    std = np.sqrt((counts * (values - mean[:, None]) ** 2).sum(axis=1) / counts.sum(axis=1))
    return tuple(mean.tolist()), tuple(std.tolist())


def pixel_statistics(info, normalization):
    """``(mean, std)`` a model trained on a dataset (`DatasetInfo`) normalises with.

    ``"official"``: the official code's constants (`OFFICIAL_MEAN`, `OFFICIAL_STD`) whatever the dataset,
    as the paper's runs had them; ``"dataset"``: the dataset's own statistics (`DatasetInfo.mean`, `.std`:
    its training split's).
    """
    check_choice("normalization", normalization, NORMALIZATIONS)
    if normalization == "official":
        return OFFICIAL_MEAN, OFFICIAL_STD
    if info.mean is None:
        raise ValueError(
            f"{info.name!r} has no training images (`x_train`, or `x`) to take its "
            f"pixel statistics from: add them, or pass normalization='official'. "
            f"Received: normalization={normalization!r}"
        )
    return info.mean, info.std


def _unknown_dataset_message(name):
    return (
        f"Unknown dataset {name!r}.{did_you_mean(name, DATASETS)} Use one of {', '.join(DATASETS)} or a "
        f"path to a .npz file with uint8 `x` (N, H, W, 3) and integer `y`, or to a folder of JPEG/PNG images, one "
        f"folder per class (DIR/<class>/ or DIR/train/<class>/ and DIR/test/<class>/). Received: dataset={name!r}"
    )


@contextlib.contextmanager
def _open_npz(name, path):
    """The open .npz archive at `path`, a file that is none being a ValueError naming it (never pickles)."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(
            f"{str(path)!r} is not a readable .npz archive ({type(error).__name__}: {error}). "
            f"Received: dataset={str(name)!r}"
        ) from None
    if not isinstance(data, np.lib.npyio.NpzFile):  # a single .npy array saved under a .npz name
        raise ValueError(
            f"{str(path)!r} holds one array, not a .npz archive of named arrays (x, y). Received: dataset={str(name)!r}"
        )
    with data:
        yield data


def _npz_array(name, data, key):
    """The array `key` of an open .npz, a damaged, truncated, oversized or pickled one being a ValueError naming it."""
    try:
        return data[key]
    except (OSError, ValueError, EOFError, MemoryError, zipfile.BadZipFile, zlib.error) as error:
        raise ValueError(
            f"The array {key!r} of {str(name)!r} cannot be read ({type(error).__name__}: {error}). "
            f"Received: dataset={str(name)!r}"
        ) from None


def _check_images(name, key, images):
    """`images` unless they are not the square uint8 RGB images (N, H, H, 3) a model takes: ValueError naming them."""
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3 or images.shape[1] != images.shape[2]:
        hint = " (channels first? the images must be NHWC)" if images.ndim == 4 and images.shape[1] == 3 else ""
        raise ValueError(
            f"The array {key!r} of {str(name)!r} must hold square uint8 RGB images (N, H, H, 3){hint}. "
            f"Received: {key} {images.dtype} {images.shape}"
        )
    return images


def _npz_splits(name, files):
    """{split: (images key, labels key)} of a .npz: ``x_<split>``/``y_<split>`` pairs, or ``x``/``y`` for all."""
    splits = {key[2:]: (key, f"y_{key[2:]}") for key in files if key.startswith("x_")}
    if "x" in files:
        splits[""] = ("x", "y")
    if not splits:
        raise ValueError(
            f"{name!r} holds no images: it needs an `x` array (or `x_<split>` arrays) of uint8 "
            f"(N, H, W, 3) and integer labels `y`. Received: arrays {sorted(files)}"
        )
    for images_key, labels_key in splits.values():
        if labels_key not in files:
            raise ValueError(
                f"{name!r} has images {images_key!r} but no labels {labels_key!r}. Received: arrays {sorted(files)}"
            )
    return splits


def _held_out_of(labels):
    """`held_out.held_out_mask` of a .npz's ``x``/``y`` (its images keyed by their position in the file)."""
    return _held_out_mask(labels.astype("int64").tobytes())


@functools.lru_cache(maxsize=4)  # dataset_info and the two splits' load_arrays ask for the same file's
def _held_out_mask(labels_bytes):
    labels = np.frombuffer(labels_bytes, dtype="int64")
    mask = held_out.held_out_mask(range(len(labels)), labels)
    mask.setflags(write=False)  # shared by the callers
    return mask


def _held_out_part(dataset, split, images, labels):
    """The `split` (``"train"`` or ``"test"``) of a .npz's ``x``/``y`` (`_held_out_of`): its images and labels."""
    chosen = _held_out_of(labels) == (split == "test")
    if split == "test" and len(labels) and not chosen.any():  # no images at all: said by the caller
        raise ValueError(
            f"{str(dataset)!r} holds `x` and `y` alone, which are split here, and holds out no test "
            f"images: a class needs 2 images or more for one to be held out as test. Add images, or "
            f"give the file `x_train`/`y_train` and `x_test`/`y_test` arrays. Received: classes of "
            f"{sorted(set(np.bincount(labels).tolist()) - {0})} images"
        )
    return images[chosen], labels[chosen]


def _integer_labels(name, split, labels):
    """Labels as int64, refusing what would be silently truncated or out of range."""
    labels = np.asarray(labels)
    where = f"{name!r} split {split!r}" if split else repr(name)
    if labels.dtype.kind not in "iuf" or labels.ndim not in (1, 2) or (labels.ndim == 2 and labels.shape[1] != 1):
        raise ValueError(
            f"The labels of {where} must be one integer per image, shape (N,). "
            f"Received: y {labels.dtype} {labels.shape}"
        )
    labels = labels.reshape(-1)
    if labels.dtype.kind == "f" and not (np.isfinite(labels).all() and (labels == np.round(labels)).all()):
        raise ValueError(
            f"The labels of {where} must be whole class numbers; float labels would be truncated. "
            f"Received: y {labels.dtype} with values such as {labels[labels != np.round(labels)][:3]}"
        )
    if labels.size and labels.min() < 0:
        raise ValueError(f"The labels of {where} must be class numbers >= 0. Received: y with min {labels.min()}")
    if labels.size and labels.max() >= MAX_LABEL:  # before the cast: uint64 or float values beyond int64 would wrap
        raise ValueError(
            f"The labels of {where} must be class numbers below {MAX_LABEL}. Received: y with max {labels.max()}"
        )
    return labels.astype("int64")


def _existing_npz(path):
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"No .npz file at {str(path)!r}. Received: dataset={str(path)!r}")
    return path


def missing_split(dataset, split, splits, argument="split"):
    """The ValueError for a `split` that `dataset` lacks: its splits, the closest, and the caller's `argument`."""
    return ValueError(
        f"{str(dataset)!r} has no split {split!r}; it has {sorted(splits)}.{did_you_mean(split, splits)} "
        f"Received: {argument}={split!r}"
    )


def load_arrays(dataset, split, *, data_dir=None, download=False, argument="split"):
    """Images (uint8, NHWC) and labels (int64, checked to lie in [0, classes)) of one split, as NumPy arrays.

    Reads the embedded sample, a local .npz (``x``/``y`` hold the data of every
    split unless the file has ``x_<split>``/``y_<split>`` arrays; an optional
    ``class_names`` array states the classes) or a tfds dataset (the whole
    split in memory: CIFAR's 50,000 images take 150 MB). Everything is checked
    here, before any training starts. ``argument``: what the caller's user calls
    the split, for the error of a split the data lacks (``"eval_split"``).
    """
    info = dataset_info(dataset)
    unsplit = False  # a .npz of x and y alone, split here
    if dataset in TFDS_DATASETS:
        images, labels = _tfds_arrays(_tfds_dataset(dataset, split, data_dir, download, argument))
    elif Path(str(dataset)).expanduser().is_dir():
        from keras_attnconv.training.image_folder import folder_arrays

        images, labels = folder_arrays(dataset, split, argument)
    else:
        path = SAMPLE_PATH if dataset == "cifar10_sample" else _existing_npz(dataset)
        with _open_npz(dataset, path) as data:
            splits = _npz_splits(dataset, data.files)
            unsplit = set(splits) == {""}
            if unsplit and split not in held_out.SPLITS:
                raise missing_split(dataset, split, held_out.SPLITS, argument)
            key = split if split in splits else ""
            if key not in splits:
                raise missing_split(dataset, split, splits, argument)
            images_key, labels_key = splits[key]
            images = _check_images(dataset, images_key, _npz_array(dataset, data, images_key))
            labels = _integer_labels(dataset, key, _npz_array(dataset, data, labels_key))
    where = f"{dataset!r} split {split!r}"
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3 or len(images) != len(labels):
        raise ValueError(
            f"{where} must hold uint8 images (N, H, W, 3) and N labels. "
            f"Received: x {images.dtype} {images.shape}, y {labels.shape}"
        )
    if unsplit:  # x/y alone: split here, as a folder without split folders is
        images, labels = _held_out_part(dataset, split, images, labels)
    if not len(images):
        raise ValueError(f"{where} holds no images. Received: x {images.shape}")
    if images.shape[1] != info.image_size:  # the model is built for the size of the training images
        raise ValueError(
            f"The images of {where} must have the size of the dataset's training images "
            f"({info.image_size}x{info.image_size}). Received: x {images.dtype} {images.shape}"
        )
    if labels.max() >= info.num_classes:
        raise ValueError(
            f"The labels of {where} must lie in [0, {info.num_classes}) for {info.num_classes} classes. "
            f"Received: y with max {labels.max()}"
        )
    return images, labels.astype("int64")


#: The data a run can take instead of tensorflow-datasets', as its errors name it.
_LOCAL_DATASET = "dataset (--dataset) an image folder (DIR/train/<class>/, DIR/test/<class>/) or a .npz file"


def _tfds_dataset(name, split, data_dir, download, argument="split"):
    """The split as tensorflow-datasets gives it; downloads only with `download`.

    Whether the data is there, and which splits it has, is left to tensorflow-datasets' own `as_dataset`
    (its error for absent data becomes ours, naming the directory): asking the builder first
    (``is_prepared``) would refuse what ``tfds.testing.mock_data`` provides with its default policy.
    """
    import tensorflow_datasets as tfds

    builder = tfds.builder(name, data_dir=data_dir)
    if download:
        _download_and_prepare(builder, name, data_dir)
    if builder.info.splits and split not in builder.info.splits:  # none known: unprepared, or mocked from code
        raise missing_split(name, split, builder.info.splits, argument)
    try:
        return builder.as_dataset(split=split, as_supervised=True, shuffle_files=False)
    except AssertionError:  # tensorflow-datasets' "could not find data in <data_dir>"
        raise FileNotFoundError(
            f"The tensorflow-datasets dataset {name!r} is not prepared in {builder.data_dir}. Pass "
            "download=True (--download true) to fetch it, data_dir (--data-dir) a directory that holds it, or "
            f"{_LOCAL_DATASET}. Received: data_dir={data_dir!r}"
        ) from None


def _download_and_prepare(builder, name, data_dir):
    """tensorflow-datasets' download and preparation (nothing to do where the data is prepared); a source it cannot
    reach (no network: it retried for minutes) is named with the ways that need none."""
    import requests  # tensorflow-datasets downloads with it

    try:
        builder.download_and_prepare()
    except requests.exceptions.ConnectionError as error:
        raise ConnectionError(
            f"tensorflow-datasets could not download {name!r}: {error}. Without a network, pass {_LOCAL_DATASET}, "
            f"or data_dir (--data-dir) a directory that holds {name!r} prepared. Received: download=True, "
            f"data_dir={data_dir!r}"
        ) from None


def _tfds_arrays(dataset, chunk=10_000):
    """The (images, labels) of a tfds split as NumPy arrays.

    In chunks: tfds' ``batch_size=-1`` makes one batch of the split's recorded size, which data without
    that record (``tfds.testing.mock_data``'s default) lacks, and a batch of every possible size aborts.
    """
    import tensorflow_datasets as tfds

    chunks = list(tfds.as_numpy(dataset.batch(chunk)))
    if not chunks:
        return np.zeros((0, 32, 32, 3), np.uint8), np.zeros(0, np.int64)
    return tuple(np.concatenate(parts) for parts in zip(*chunks))


def load_dataset(
    dataset,
    split,
    *,
    batch_size,
    data_dir=None,
    download=False,
    augment=None,
    shuffle=None,
    seed=None,
    drop_remainder=None,
):
    """A batched ``tf.data.Dataset`` of (uint8 images, int64 labels) ready for a zoo model's ``fit``.

    Args:
        dataset: ``"cifar10"``, ``"cifar100"`` (tensorflow-datasets),
            ``"cifar10_sample"`` (real CIFAR-10 images shipped in the package:
            2,500 train / 500 validation), a path to a ``.npz`` file or to a
            folder of images (`keras_attnconv.training.image_folder`).
        split: ``"train"``, ``"test"`` (tfds), ``"validation"`` (sample), ...
        batch_size: int, global batch size.
        data_dir: tfds data directory (default: tfds' own).
        download: whether tfds may download and prepare a missing dataset.
            When False and the data is absent, raises FileNotFoundError naming
            the directory; no network access is attempted.
        augment: pad by 4 pixels + random crop and random horizontal flip.
            Default: on for ``"train"``.
        shuffle: default: on for ``"train"``.
        seed: int or None; with a seed, shuffling and augmentation are
            deterministic (different in each epoch, the same in each run).
        drop_remainder: default: True for ``"train"`` (static batch shape for
            XLA), False otherwise.
    """
    import tensorflow as tf

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer. Received: batch_size={batch_size!r}")
    training = split == "train"
    augment = training if augment is None else augment
    shuffle = training if shuffle is None else shuffle
    drop_remainder = training if drop_remainder is None else drop_remainder
    dataset_info(dataset)  # an unknown dataset fails here, with the closest known one
    if dataset in TFDS_DATASETS:
        pipeline = _tfds_dataset(dataset, split, data_dir, download)
        size = None
    else:
        images, labels = load_arrays(dataset, split)
        pipeline = tf.data.Dataset.from_tensor_slices((images, labels))
        size = len(labels)
    if shuffle:
        pipeline = pipeline.shuffle(size or 50_000, seed=seed, reshuffle_each_iteration=True)
    if augment:
        # One stateless seed per example, drawn afresh each epoch but reproducible from `seed`.
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
        pipeline = tf.data.Dataset.zip(pipeline, seeds).map(_augment, num_parallel_calls=tf.data.AUTOTUNE)
    pipeline = pipeline.map(lambda image, label: (image, tf.cast(label, tf.int64)))
    return pipeline.batch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)


def _augment(example, seed):
    import tensorflow as tf

    image, label = example
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 2)
    crop_seed, flip_seed = seeds[0], seeds[1]
    shape = tf.shape(image)
    padded = tf.pad(image, [[PAD, PAD], [PAD, PAD], [0, 0]])
    image = tf.image.stateless_random_crop(padded, shape, seed=crop_seed)
    return tf.image.stateless_random_flip_left_right(image, seed=flip_seed), label
