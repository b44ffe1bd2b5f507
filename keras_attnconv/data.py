"""Datasets for training and evaluation: CIFAR-10/100 (tfds), the embedded sample, local .npz.

`load_dataset` returns a batched ``tf.data.Dataset`` of ``(normalised float32
images, int labels)`` ready for ``model.fit``. `load_arrays` returns the raw
uint8 images as NumPy arrays and needs no TensorFlow for the embedded sample
and local files (the GPU machine has none). TensorFlow and tfds are imported
inside the functions that need them.
"""

import dataclasses
from pathlib import Path

import numpy as np

from keras_attnconv.layers.validation import closest_names

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# Per-channel statistics of the training sets (pixels scaled to [0, 1]).
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

SAMPLE_PATH = Path(__file__).parent / "assets" / "cifar10_sample.npz"
TFDS_DATASETS = ("cifar10", "cifar100")
DATASETS = (*TFDS_DATASETS, "cifar10_sample")
PAD = 4  # pixels of zero padding before the random crop


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model and an export need to know about a dataset."""

    name: str
    num_classes: int
    class_names: tuple
    mean: tuple
    std: tuple
    eval_split: str
    image_size: int = 32


def dataset_info(name):
    """`DatasetInfo` of a dataset name or a local .npz path."""
    if name == "cifar100":
        names = tuple(str(i) for i in range(100))
        return DatasetInfo(name, 100, names, CIFAR100_MEAN, CIFAR100_STD, "test")
    if name == "cifar10":
        return DatasetInfo(name, 10, CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD, "test")
    if name == "cifar10_sample":
        return DatasetInfo(name, 10, CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD, "validation")
    if str(name).endswith(".npz"):
        with np.load(_existing_npz(name)) as data:
            labels = np.concatenate([data[k] for k in data.files if k == "y" or k.startswith("y_")])
            image_size = int(data[next(k for k in data.files if k == "x" or k.startswith("x_"))].shape[1])
        num_classes = max(int(labels.max()) + 1, 2)
        names = CIFAR10_CLASSES if num_classes == 10 else tuple(str(i) for i in range(num_classes))
        return DatasetInfo(str(name), num_classes, names, CIFAR10_MEAN, CIFAR10_STD, "test", image_size)
    raise ValueError(_unknown_dataset_message(name))


def _unknown_dataset_message(name):
    suggestions = closest_names(name, DATASETS)
    hint = f" Did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
    return (f"Unknown dataset {name!r}.{hint} Use one of {', '.join(DATASETS)} or a path to a .npz file "
            f"with uint8 `x` (N, H, W, 3) and integer `y`. Received: name={name!r}")


def _existing_npz(path):
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"No .npz file at {str(path)!r}. Received: name={str(path)!r}")
    return path


def load_arrays(name, split):
    """Images (uint8, NHWC) and labels (int64) of the embedded sample or a local .npz.

    For a local file, ``x``/``y`` hold the data of every split unless the file
    has ``x_<split>``/``y_<split>`` arrays.
    """
    if name == "cifar10_sample":
        path = SAMPLE_PATH
    elif str(name).endswith(".npz"):
        path = _existing_npz(name)
    else:
        raise ValueError(f"load_arrays reads the embedded sample or a .npz file. Received: name={name!r}")
    with np.load(path) as data:
        keys = (f"x_{split}", f"y_{split}") if f"x_{split}" in data.files else ("x", "y")
        if keys[0] not in data.files:
            splits = sorted(k[2:] for k in data.files if k.startswith("x_"))
            raise ValueError(f"{name!r} has no split {split!r}; it has {splits}. Received: split={split!r}")
        images, labels = data[keys[0]], data[keys[1]].astype("int64").reshape(-1)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3 or len(images) != len(labels):
        raise ValueError(f"{name!r} must hold uint8 images (N, H, W, 3) and N labels. "
                         f"Received: x {images.dtype} {images.shape}, y {labels.shape}")
    return images, labels


def normalize_numpy(images, info):
    """uint8 images -> float32 normalised with the dataset's per-channel statistics."""
    return ((images.astype("float32") / 255.0 - np.float32(info.mean)) / np.float32(info.std)).astype("float32")


def _tfds_dataset(name, split, data_dir, download):
    import tensorflow_datasets as tfds

    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        if not download:
            raise FileNotFoundError(
                f"{name} is not prepared in data_dir={str(data_dir or builder.data_dir)!r} "
                f"(looked for {builder.data_dir}). Pass download=True (--download) to fetch it with "
                "tensorflow-datasets, or point data_dir at a directory that holds it."
            )
        builder.download_and_prepare()
    if split not in builder.info.splits:
        raise ValueError(f"{name} has splits {sorted(builder.info.splits)}. Received: split={split!r}")
    return builder.as_dataset(split=split, as_supervised=True, shuffle_files=False)


def load_dataset(name, split, *, batch_size, data_dir=None, download=False, augment=None, shuffle=None,
                 seed=None, drop_remainder=None):
    """A batched ``tf.data.Dataset`` of (normalised images, labels) ready for ``fit``.

    Args:
        name: ``"cifar10"``, ``"cifar100"`` (tensorflow-datasets),
            ``"cifar10_sample"`` (real CIFAR-10 images shipped in the package:
            2,500 train / 500 validation) or a path to a ``.npz`` file.
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
    info = dataset_info(name)
    if name in TFDS_DATASETS:
        dataset = _tfds_dataset(name, split, data_dir, download)
        size = None
    else:
        images, labels = load_arrays(name, split)
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
        size = len(labels)
    if shuffle:
        dataset = dataset.shuffle(size or 50_000, seed=seed, reshuffle_each_iteration=True)
    mean, std = tf.constant(info.mean, tf.float32), tf.constant(info.std, tf.float32)

    def normalize(image, label):
        return (tf.cast(image, tf.float32) / 255.0 - mean) / std, tf.cast(label, tf.int64)

    if augment:
        # One stateless seed per example, drawn afresh each epoch but reproducible from `seed`.
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
        dataset = tf.data.Dataset.zip(dataset, seeds).map(_augment, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.map(normalize, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)


def _augment(example, seed):
    import tensorflow as tf

    image, label = example
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 2)
    crop_seed, flip_seed = seeds[0], seeds[1]
    shape = tf.shape(image)
    padded = tf.pad(image, [[PAD, PAD], [PAD, PAD], [0, 0]])
    image = tf.image.stateless_random_crop(padded, shape, seed=crop_seed)
    return tf.image.stateless_random_flip_left_right(image, seed=flip_seed), label

