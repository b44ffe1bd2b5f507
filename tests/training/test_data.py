"""Specifications of the data pipeline: embedded sample, local .npz, tfds without download, augmentation."""

import re

import numpy as np
import pytest

from keras_attnconv.training import data


def first_batch(dataset):
    images, labels = next(iter(dataset))
    return images.numpy(), labels.numpy()


def test_embedded_sample_is_real_balanced_cifar10():
    x_train, y_train = data.load_arrays("cifar10_sample", "train")
    x_val, y_val = data.load_arrays("cifar10_sample", "validation")
    assert x_train.shape == (2500, 32, 32, 3) and x_val.shape == (500, 32, 32, 3)
    assert x_train.dtype == np.uint8
    assert np.bincount(y_train).tolist() == [250] * 10
    assert np.bincount(y_val).tolist() == [50] * 10
    assert 60 < x_train.mean() < 180 and x_train.std() > 40  # natural images, not noise or zeros


def test_evaluation_split_is_the_raw_pixels_neither_shuffled_nor_augmented():
    images, labels = first_batch(data.load_dataset("cifar10_sample", "validation", batch_size=16))
    x, y = data.load_arrays("cifar10_sample", "validation")
    np.testing.assert_array_equal(images, x[:16])  # uint8: the models normalise their input themselves
    np.testing.assert_array_equal(labels, y[:16])


def test_training_pipeline_is_deterministic_with_a_seed_and_varies_across_epochs():
    def make():
        return data.load_dataset("cifar10_sample", "train", batch_size=32, seed=7)

    first, again = first_batch(make()), first_batch(make())
    np.testing.assert_array_equal(first[0], again[0])
    dataset = make()
    epoch_one, epoch_two = first_batch(dataset), first_batch(dataset)
    assert not np.array_equal(epoch_one[0], epoch_two[0])
    assert first[0].shape == (32, 32, 32, 3) and first[0].dtype == np.uint8


def test_augmentation_is_a_padded_crop_with_optional_flip(tmp_path):
    rng = np.random.default_rng(0)
    image = rng.integers(1, 255, (1, 32, 32, 3), dtype=np.uint8)  # no zero pixel in the original
    path = tmp_path / "one.npz"
    np.savez(path, x_train=np.repeat(image, 64, axis=0), y_train=np.arange(64) % 2)  # all 64 trained on
    augmented, _ = first_batch(data.load_dataset(str(path), "train", batch_size=64, seed=1))
    padded = np.pad(image[0], ((4, 4), (4, 4), (0, 0)), constant_values=0)
    seen_flip = seen_shift = False
    for sample in augmented:
        matches = [
            (dy, dx, flip)
            for dy in range(9)
            for dx in range(9)
            for flip in (False, True)
            if np.allclose((padded[:, ::-1] if flip else padded)[dy : dy + 32, dx : dx + 32], sample, atol=1e-5)
        ]
        assert matches, "an augmented image must be a 32x32 crop of the padded (and maybe flipped) image"
        seen_flip |= any(flip for _, _, flip in matches)
        seen_shift |= any((dy, dx) != (4, 4) for dy, dx, _ in matches)
    assert seen_flip and seen_shift


def test_local_npz_with_splits(tmp_path):
    path = tmp_path / "mine.npz"
    rng = np.random.default_rng(1)
    np.savez(
        path,
        x_train=rng.integers(0, 255, (10, 8, 8, 3), dtype=np.uint8),
        y_train=np.arange(10) % 3,
        x_test=rng.integers(0, 255, (4, 8, 8, 3), dtype=np.uint8),
        y_test=np.arange(4) % 3,
    )
    images, labels = first_batch(data.load_dataset(str(path), "test", batch_size=4))
    assert images.shape == (4, 8, 8, 3) and labels.tolist() == [0, 1, 2, 0]
    assert data.dataset_info(str(path)).num_classes == 3
    with pytest.raises(ValueError, match="split='validation'"):
        data.load_dataset(str(path), "validation", batch_size=4)


def test_bad_npz_contents_are_rejected(tmp_path):
    path = tmp_path / "floats.npz"
    np.savez(path, x=np.zeros((4, 8, 8, 3), "float32"), y=np.arange(4) % 2)
    with pytest.raises(ValueError, match="uint8"):
        data.load_arrays(str(path), "train")
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        data.load_arrays(str(tmp_path / "missing.npz"), "train")


@pytest.mark.parametrize("given", ["a folder", None])
def test_missing_tfds_data_without_download_names_the_data_dir_and_the_other_ways(tmp_path, monkeypatch, given):
    from tensorflow_datasets.core import constants

    monkeypatch.setattr(constants, "DATA_DIR", str(tmp_path / "default"))  # where tensorflow-datasets looks at first
    data_dir = None if given is None else str(tmp_path / given)
    looked_in = re.escape(str(tmp_path / (given or "default") / "cifar10" / ""))
    with pytest.raises(
        FileNotFoundError,
        match=f"^The tensorflow-datasets dataset 'cifar10' is not prepared in {looked_in}.*Pass download=True "
        r"\(--download true\) to fetch it, data_dir \(--data-dir\) a directory that holds it, or dataset "
        r"\(--dataset\) an image folder .* or a \.npz file\. "
        f"Received: data_dir={re.escape(repr(data_dir))}$",
    ):
        data.load_dataset("cifar10", "train", batch_size=8, data_dir=data_dir, download=False)


class DownloadStarted(Exception):
    """Raised where tensorflow-datasets starts downloading: the tests never reach the network."""


def stop_tfds_download(monkeypatch, error):
    from tensorflow_datasets.core.download import download_manager

    def download_and_extract(manager, url):
        raise error(url)

    monkeypatch.setattr(download_manager.DownloadManager, "download_and_extract", download_and_extract)


def test_a_tfds_download_reaches_its_source_with_the_packages_dependencies(tmp_path, monkeypatch):
    # tensorflow-datasets 4.9 prepares a dataset with importlib_resources, which it declares for Python < 3.9 only
    # (tensorflow/datasets#11212): `--download true` failed with ModuleNotFoundError before any download.
    stop_tfds_download(monkeypatch, DownloadStarted)
    with pytest.raises(DownloadStarted, match="cifar-10"):
        data.load_dataset("cifar10", "train", batch_size=8, data_dir=str(tmp_path), download=True)


def test_a_tfds_download_without_a_network_names_the_ways_that_need_none(tmp_path, monkeypatch):
    import requests

    stop_tfds_download(monkeypatch, lambda url: requests.exceptions.ConnectionError(f"no route to {url}"))
    with pytest.raises(
        ConnectionError,
        match=r"^tensorflow-datasets could not download 'cifar10': no route to \S*cifar-10\S*\. Without a network, "
        r"pass dataset \(--dataset\) an image folder .* or a \.npz file, or data_dir \(--data-dir\) a directory "
        f"that holds 'cifar10' prepared\\. Received: download=True, data_dir={re.escape(repr(str(tmp_path)))}$",
    ):
        data.load_dataset("cifar10", "train", batch_size=8, data_dir=str(tmp_path), download=True)


def test_a_split_a_tfds_dataset_lacks_is_named_with_the_closest_and_the_users_argument(monkeypatch):
    # As a .npz's or a folder's missing split is: `--eval-split tset` names eval_split and suggests 'test'.
    import types

    import tensorflow_datasets as tfds

    prepared = types.SimpleNamespace(info=types.SimpleNamespace(splits={"train": None, "test": None}))
    monkeypatch.setattr(tfds, "builder", lambda name, data_dir=None: prepared)
    message = r"^'cifar10' has no split 'tset'; it has \['test', 'train'\]\. Did you mean 'test'\? Received: {}='tset'$"
    with pytest.raises(ValueError, match=message.format("eval_split")):
        data.load_arrays("cifar10", "tset", argument="eval_split")
    with pytest.raises(ValueError, match=message.format("split")):
        data.load_dataset("cifar10", "tset", batch_size=8)


def test_unknown_dataset_is_named_with_a_suggestion():
    with pytest.raises(ValueError, match="Did you mean 'cifar10'.*dataset='cifar11'"):
        data.load_dataset("cifar11", "train", batch_size=8)


def test_bad_batch_size_is_named():
    with pytest.raises(ValueError, match="batch_size=0"):
        data.load_dataset("cifar10_sample", "train", batch_size=0)


def npz(tmp_path, name="data.npz", **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return str(path)


IMAGES = np.zeros((6, 8, 8, 3), np.uint8)


def _distinct_images(count):
    """`count` 8x8 images that differ: image i holds i in its first two pixels (base 256)."""
    images = np.zeros((count, 8, 8, 3), np.uint8)
    images[:, 0, 0, 0], images[:, 0, 1, 0] = np.arange(count) % 256, np.arange(count) // 256
    return images


def test_an_npz_of_x_and_y_alone_holds_out_a_tenth_of_each_class_for_evaluation(tmp_path):
    # As a folder without split folders: never evaluated on the images it trains on.
    labels = np.repeat([0, 1, 2], [20, 9, 2])
    np.random.default_rng(0).shuffle(labels)
    path = npz(tmp_path, x=_distinct_images(len(labels)), y=labels)
    assert data.dataset_info(path).eval_split == "test"
    (x_train, y_train), (x_test, y_test) = (data.load_arrays(path, split) for split in ("train", "test"))
    assert np.bincount(y_test).tolist() == [2, 1, 1]  # 10% of each class, at least one
    position = {image.tobytes(): i for i, image in enumerate(_distinct_images(len(labels)))}
    train, test = ([position[image.tobytes()] for image in x] for x in (x_train, x_test))
    assert not set(train) & set(test) and sorted(train + test) == list(range(len(labels)))
    assert train == sorted(train) and test == sorted(test)  # the file's order
    assert labels[train].tolist() == y_train.tolist() and labels[test].tolist() == y_test.tolist()
    data._held_out_mask.cache_clear()  # the same split computed again, not drawn at random
    np.testing.assert_array_equal(data.load_arrays(path, "test")[0], x_test)


def test_the_statistics_of_an_npz_of_x_and_y_alone_are_those_of_its_training_images(tmp_path):
    labels = np.arange(40) % 2
    images = _distinct_images(40)
    images[data._held_out_of(labels)] = 255  # held-out images unlike the others: they must not count
    path = npz(tmp_path, x=images, y=labels)
    info = data.dataset_info(path)
    assert (info.mean, info.std) == data._channel_statistics(data.load_arrays(path, "train")[0])
    assert info.mean != data._channel_statistics(images)[0]


def test_an_npz_of_x_and_y_alone_with_one_image_a_class_says_why_it_has_no_test_images(tmp_path):
    path = npz(tmp_path, x=IMAGES[:3], y=np.arange(3))
    with pytest.raises(ValueError, match=r"holds out no test images: a class needs 2 images.*classes of \[1\] images"):
        data.load_arrays(path, "test")
    assert len(data.load_arrays(path, "train")[0]) == 3


def test_an_npz_of_x_and_y_alone_has_a_train_and_a_test_split_only(tmp_path):
    path = npz(tmp_path, x=IMAGES, y=np.arange(6) % 2)
    with pytest.raises(ValueError, match=r"has no split 'validation'; it has \['test', 'train'\].*eval_split="):
        data.load_arrays(path, "validation", argument="eval_split")


@pytest.mark.parametrize(
    "arrays, message",
    [
        (
            {"x": IMAGES, "y": np.array([0, 1, 2, 0, 1, 5]), "class_names": np.array(["a", "b", "c"])},
            r"must lie in \[0, 3\).*max 5",
        ),
        ({"x": IMAGES, "y": np.array([0, 1, -1, 0, 1, 1])}, "class numbers >= 0.*min -1"),
        ({"x": IMAGES, "y": np.array([0, 1.5, 2, 0, 1, 1])}, "float labels would be truncated"),
        ({"x": IMAGES, "y": np.array(["a"] * 6)}, "one integer per image"),
        ({"x": IMAGES}, "no labels 'y'"),
        ({"y": np.zeros(6, int)}, "holds no images"),
        ({"x": IMAGES[:0], "y": np.zeros(0, int), "class_names": np.array(["a", "b"])}, "holds no images"),
        ({"x": IMAGES, "y": np.zeros(6, int)}, "at least 2 classes"),
        # A 2-D class_names used to be read row by row, and the labels blamed for the count that came out.
        (
            {"x": IMAGES, "y": np.array([0, 1, 0, 1, 0, 1]), "class_names": np.array([["a", "b"], ["c", "d"]])},
            r"'class_names'.*1-D array of strings.*\(2, 2\)",
        ),
        ({"x": IMAGES, "y": np.array([0, 1, 0, 1, 0, 1]), "class_names": np.array([0, 1])}, "1-D array of strings"),
    ],
)
def test_bad_npz_labels_and_arrays_are_named(tmp_path, arrays, message):
    with pytest.raises(ValueError, match=message):
        data.load_arrays(npz(tmp_path, **arrays), "train")


def test_whole_float_labels_and_stated_class_names_are_accepted(tmp_path):
    labels = np.array([0.0, 1.0, 2.0, 0.0, 1.0, 1.0])
    path = npz(tmp_path, x_train=IMAGES, y_train=labels, class_names=np.array(list("abcd")))  # all trained on
    images, labels = data.load_arrays(path, "train")
    assert labels.dtype == np.int64 and labels.tolist() == [0, 1, 2, 0, 1, 1]
    assert data.dataset_info(path).class_names == ("a", "b", "c", "d")  # 4 classes stated, 3 seen


def _huge_declared_shape(path):
    """An .npz whose x.npy header declares 10^12 images but holds a few bytes."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (10**12, 32, 32, 3)})
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", header.getvalue() + b"\0" * 64)
        labels = io.BytesIO()
        np.save(labels, np.zeros(4, "int64"))
        archive.writestr("y.npy", labels.getvalue())


def _truncated(path):
    np.savez(path, x=np.zeros((40, 8, 8, 3), np.uint8), y=np.arange(40) % 2)
    path.write_bytes(path.read_bytes()[:300])


FOUR_IMAGES = np.zeros((4, 8, 8, 3), np.uint8)
BAD_FILES = {
    "1-D images": (lambda p: np.savez(p, x=np.zeros(12, np.uint8), y=np.arange(4) % 2), r"x uint8 \(12,\)"),
    "5-D images": (
        lambda p: np.savez(p, x=np.zeros((4, 1, 8, 8, 3), np.uint8), y=np.arange(4) % 2),
        r"x uint8 \(4, 1, 8, 8, 3\)",
    ),
    "channels first": (
        lambda p: np.savez(p, x=np.zeros((4, 3, 8, 8), np.uint8), y=np.arange(4) % 2),
        r"channels first\?.*x uint8 \(4, 3, 8, 8\)",
    ),
    "not square": (
        lambda p: np.savez(p, x=np.zeros((4, 8, 6, 3), np.uint8), y=np.arange(4) % 2),
        r"square.*x uint8 \(4, 8, 6, 3\)",
    ),
    "object arrays": (
        lambda p: np.savez(p, x=FOUR_IMAGES, y=np.array([0, "a", 1, 2], dtype=object)),
        r"The array 'y' of .* cannot be read",
    ),
    "a text file": (lambda p: p.write_text("x,y\n1,2\n"), "is not a readable .npz archive"),
    "a truncated file": (_truncated, "cannot be read|is not a readable .npz archive"),
    "a huge declared shape": (_huge_declared_shape, r"The array 'x' of .* cannot be read"),
    "uint64 labels beyond int64": (
        lambda p: np.savez(p, x=FOUR_IMAGES, y=np.array([0, 1, 2**63, 1], np.uint64)),
        r"below 2147483648.*max 9223372036854775808",
    ),
    "float labels of 1e20": (
        lambda p: np.savez(p, x=FOUR_IMAGES, y=np.array([0.0, 1.0, 1e20, 1.0])),
        r"below 2147483648.*max 1e\+20",
    ),
    "a label equal to the number of classes": (
        lambda p: np.savez(p, x=FOUR_IMAGES, y=np.array([0, 1, 2, 3]), class_names=np.array(["a", "b", "c"])),
        r"must lie in \[0, 3\).*max 3",
    ),
}


@pytest.mark.parametrize("damage", BAD_FILES)
def test_a_bad_npz_is_an_error_naming_the_file_and_what_is_wrong(tmp_path, damage):
    make, message = BAD_FILES[damage]
    path = tmp_path / "data.npz"
    make(path)
    with pytest.raises(ValueError, match=message) as error:
        data.load_arrays(str(path), "train")
    assert str(path) in str(error.value)


@pytest.mark.parametrize("training", ["x_train", "x"])  # the training split, or the images of every split
def test_a_npz_normalises_with_its_training_images_own_statistics(tmp_path, training):
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (20, 8, 8, 3), dtype=np.uint8) // np.array([4, 1, 2], np.uint8)  # unlike CIFAR
    labels = "y_train" if training == "x_train" else "y"
    others = rng.integers(200, 256, (4, 8, 8, 3), dtype=np.uint8)  # another split's: not counted
    path = npz(tmp_path, **{training: images, labels: np.arange(20) % 2}, x_test=others, y_test=np.arange(4) % 2)
    info = data.dataset_info(path)
    np.testing.assert_allclose(info.mean, (images / 255).mean(axis=(0, 1, 2)), rtol=1e-9)
    np.testing.assert_allclose(info.std, (images / 255).std(axis=(0, 1, 2)), rtol=1e-9)
    assert data.pixel_statistics(info, "dataset") == (info.mean, info.std)
    assert data.pixel_statistics(info, "official") == (data.OFFICIAL_MEAN, data.OFFICIAL_STD)


def test_the_embedded_sample_normalises_with_its_training_images_own_statistics():
    images, _ = data.load_arrays("cifar10_sample", "train")
    info = data.dataset_info("cifar10_sample")
    np.testing.assert_allclose(info.mean, (images / 255).mean(axis=(0, 1, 2)), rtol=1e-9)
    np.testing.assert_allclose(info.std, (images / 255).std(axis=(0, 1, 2)), rtol=1e-9)


def test_a_npz_without_training_images_has_no_statistics_to_normalise_with(tmp_path):
    info = data.dataset_info(npz(tmp_path, x_test=IMAGES, y_test=np.arange(6) % 2))
    with pytest.raises(ValueError, match="no training images.*Received: normalization='dataset'"):
        data.pixel_statistics(info, "dataset")


def test_every_split_has_the_size_of_the_training_images(tmp_path):
    path = npz(
        tmp_path,
        x_train=IMAGES,
        y_train=np.arange(6) % 2,
        x_test=np.zeros((2, 16, 16, 3), np.uint8),
        y_test=np.arange(2),
    )
    with pytest.raises(ValueError, match=r"size of the dataset's training images \(8x8\).*x uint8 \(2, 16, 16, 3\)"):
        data.load_arrays(path, "test")
