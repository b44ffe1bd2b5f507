"""Specifications of the NumPy training batches: the paper's augmentation and cutout, and every batch a function
of (seed, epoch, index), which is what makes a resumed run reproduce an uninterrupted one."""

import re

import numpy as np
import pytest

from keras_attnconv.training import data
from keras_attnconv.training.input_pipeline import ArrayBatches, augment_batch


def batches(images, labels, **overrides):
    args = {"batch_size": 8, "augment": True, "shuffle": True, "seed": 3, "drop_remainder": True}
    return ArrayBatches(images, labels, **{**args, **overrides})


@pytest.fixture(scope="module")
def sample():
    images, labels = data.load_arrays("cifar10_sample", "validation")
    return images[:40], labels[:40]


def test_every_batch_is_a_function_of_seed_epoch_and_index(sample):
    first, second = batches(*sample), batches(*sample)
    first.epoch = second.epoch = 2
    for index in (4, 0, 2):  # any order, as prefetching threads would ask
        np.testing.assert_array_equal(first[index][0], second[index][0])
    second.epoch = 3
    assert not np.array_equal(first[0][0], second[0][0])
    assert not np.array_equal(first[0][0], batches(*sample, seed=4)[0][0])


def test_one_epoch_visits_every_image_once_with_its_label_as_raw_pixels(sample):
    plain = batches(*sample, augment=False)
    labels = np.concatenate([plain[i][1] for i in range(len(plain))])
    images = np.concatenate([plain[i][0] for i in range(len(plain))])
    assert images.dtype == np.uint8  # the models normalise their input themselves
    assert len(plain) == 5 and sorted(labels.tolist()) == sorted(sample[1].tolist())
    order = [int(np.argmin(np.abs(sample[0].astype(int) - image).sum(axis=(1, 2, 3)))) for image in images]
    assert sorted(order) == list(range(40)) and (sample[1][order] == labels).all()
    np.testing.assert_array_equal(images, sample[0][order])


def test_steps_per_epoch_cuts_epochs_from_an_endless_sequence_of_passes(sample):
    whole = batches(*sample)  # 5 batches per pass
    cut = batches(*sample, steps_per_epoch=3)
    cut.epoch = 1  # batches 3, 4 of pass 0, then batch 0 of pass 1
    whole.epoch = 0
    np.testing.assert_array_equal(cut[0][0], whole[3][0])
    whole.epoch = 1
    np.testing.assert_array_equal(cut[2][0], whole[0][0])


# A 6x6 image of distinct pixels: every crop of its 4-pixel zero padding shows at least 2x2 of it,
# so each augmented image tells its crop offset and flip exactly.
IMAGE = (np.arange(36, dtype=np.uint8).reshape(1, 6, 6, 1) + 1).repeat(3, axis=-1)


def crops_and_flips(augmented, image=IMAGE):
    """(top, left, flip) of each augmented image; fails on an image that is no such crop."""
    padded = np.pad(image[0], ((4, 4), (4, 4), (0, 0)))
    candidates = {}
    for top in range(9):
        for left in range(9):
            crop = padded[top : top + 6, left : left + 6]
            candidates[crop.tobytes()] = (top, left, False)
            candidates[crop[:, ::-1].tobytes()] = (top, left, True)
    found = [candidates.get(np.ascontiguousarray(a).tobytes()) for a in augmented]
    assert None not in found, "an augmented image must be a crop of the zero-padded image, maybe flipped"
    return np.array(found)


def assert_uniform_offsets_and_flips(found):
    # Each of the 9 offsets per axis has probability 1/9 and a flip 1/2 (4.5 standard errors of slack).
    count = len(found)
    for axis in (0, 1):
        frequencies = np.bincount(found[:, axis], minlength=9) / count
        np.testing.assert_allclose(frequencies, 1 / 9, atol=4.5 * np.sqrt(1 / 9 * 8 / 9 / count))
    assert abs(found[:, 2].mean() - 0.5) < 4.5 * np.sqrt(0.25 / count)
    assert len({(top, left) for top, left, _ in found}) == 81


def test_augmentation_is_a_uniform_crop_of_the_zero_padded_image_maybe_flipped():
    augmented = augment_batch(np.repeat(IMAGE, 4000, axis=0), np.random.default_rng(1))
    assert_uniform_offsets_and_flips(crops_and_flips(augmented))


def test_cutout_sets_a_square_centered_on_a_uniform_pixel_and_leaves_the_rest_as_without_it():
    images, size, fill = np.repeat(IMAGE, 4000, axis=0), 3, (200, 201, 202)  # no pixel of IMAGE (1-36) or padding
    plain = augment_batch(images, np.random.default_rng(1))
    cut = augment_batch(images, np.random.default_rng(1), cutout=size, cutout_fill=np.uint8(fill))
    covered = (cut == fill).all(axis=-1)
    # Drawn after the crops and flips: outside its square each image is the one made without cutout.
    np.testing.assert_array_equal(cut[~covered], plain[~covered])
    # One square a image, cut by the image's border: its rows and columns are runs of at most `size`.
    rows, columns = covered.any(axis=2), covered.any(axis=1)
    np.testing.assert_array_equal(covered.sum(axis=(1, 2)), rows.sum(axis=1) * columns.sum(axis=1))
    for lines in (rows, columns):
        assert ((1 <= lines.sum(axis=1)) & (lines.sum(axis=1) <= size)).all()
        first, last = lines.argmax(axis=1), lines.shape[1] - 1 - lines[:, ::-1].argmax(axis=1)
        np.testing.assert_array_equal(last - first + 1, lines.sum(axis=1))  # contiguous
    # Centered on a pixel drawn uniformly: each pixel is covered with the probability that a uniform center lies
    # within size // 2 of it, on either axis (4.5 standard errors of slack).
    offsets = np.arange(6)[:, None] - np.arange(6)[None, :]  # pixel minus center, on one axis
    on_axis = ((offsets >= -(size // 2)) & (offsets < size - size // 2)).mean(axis=1)
    expected = on_axis[:, None] * on_axis[None, :]
    tolerance = 4.5 * np.sqrt(expected * (1 - expected) / len(images))
    assert (np.abs(covered.mean(axis=0) - expected) <= tolerance).all(), covered.mean(axis=0) - expected


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"cutout": 32}, "smaller than the images' 32x32. Received: cutout=32"),
        ({"cutout": -1}, "Received: cutout=-1"),
        ({"cutout": 2.5}, "Received: cutout=2.5"),
        ({"cutout": True}, "Received: cutout=True"),
        ({"cutout": 8, "augment": False}, "needs augment=True. Received: cutout=8"),
    ],
)
def test_bad_cutouts_are_named(sample, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        batches(*sample, **overrides)


def test_the_tf_data_pipeline_draws_from_the_same_distribution(tmp_path):
    pytest.importorskip("tensorflow")
    path = tmp_path / "one.npz"
    np.savez(path, x_train=np.repeat(IMAGE, 4000, axis=0), y_train=np.arange(4000) % 2)  # all 4000 trained on
    dataset = data.load_dataset(str(path), "train", batch_size=4000, seed=5)
    pixels = next(iter(dataset))[0].numpy()
    assert pixels.dtype == np.uint8
    assert_uniform_offsets_and_flips(crops_and_flips(pixels))


def test_bad_sizes_are_named(sample):
    with pytest.raises(ValueError, match="fewer than one batch.*batch_size=64"):
        batches(*sample, batch_size=64)
    with pytest.raises(ValueError, match="steps_per_epoch=0"):
        batches(*sample, steps_per_epoch=0)


def test_images_that_are_not_raw_pixels_are_refused(sample):
    # Normalised floats would be taken for pixels: the models normalise uint8 pixels themselves.
    with pytest.raises(ValueError, match="uint8 array.*Received: images float32"):
        batches(sample[0].astype("float32") / 255, sample[1])


def test_asking_for_a_second_pass_after_a_first_gives_what_a_fresh_pipeline_gives(sample):
    # The order of a pass is cached per pass: a cache left by the first pass must not leak into the second.
    used, fresh = batches(*sample), batches(*sample)
    for epoch, pipeline in ((0, used), (1, used), (1, fresh)):
        pipeline.epoch = epoch
        if pipeline is used and epoch == 0:
            [pipeline[i] for i in range(len(pipeline))]
    for index in range(len(used)):
        for a, b in zip(used[index], fresh[index]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("count", [39, 41])
def test_labels_of_another_count_than_the_images_are_refused_when_made(sample, count):
    # Fewer labels used to raise an IndexError only when a batch past them was read, in the middle of `fit`.
    images, labels = sample
    with pytest.raises(ValueError, match=f"one class number per image.*shape \\({count},\\) for 40 images"):
        batches(images, np.resize(labels, count))
