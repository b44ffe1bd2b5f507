"""The training input pipeline: NumPy batches whose order and augmentation are a function of (seed, epoch).

`ArrayBatches` is a `keras.utils.PyDataset`, so the same pipeline feeds
``model.fit`` on every backend (the GPU machine has JAX and no TensorFlow).
Every batch is a pure function of ``(seed, epoch, batch index)``: a run
resumed at epoch ``e`` sees exactly the batches that an uninterrupted run
sees from epoch ``e`` on, which is what makes a killed-and-resumed run
reproduce the uninterrupted one. `EpochSync` tells the batches which epoch
``fit`` is in (Keras calls a PyDataset's own ``on_epoch_end`` irregularly,
e.g. after peeking at the first batch, so it cannot count epochs itself).
The batches hold the raw uint8 pixels: every model of the zoo normalises its
input itself (`keras_attnconv.layers.PixelNormalization`).

The augmentation is the paper's (and `keras_attnconv.training.data.load_dataset`'s):
zero padding by 4 pixels, a random crop back to the image size (each of the
9 x 9 offsets equally likely) and a horizontal flip with probability 1/2.
A run may add cutout (`cut_out_squares`, the recipe field ``cutout``), drawn
after the rest, so that the batches without it stay what they were.
"""

import keras
import numpy as np

from keras_attnconv.training.data import PAD
from keras_attnconv.training.recipe import check_cutout
from keras_attnconv.utils.checks import check_positive_int


class ArrayBatches(keras.utils.PyDataset):
    """Batches of (uint8 images, int64 labels) from uint8 arrays in memory.

    Args:
        images: uint8 array (N, H, W, 3).
        labels: int array (N,).
        batch_size: int, images per batch.
        augment: bool, pad + random crop + random flip.
        cutout: int, with `augment`: the side of the square that cutout
            (`cut_out_squares`) sets to `cutout_fill` in each image; 0: none.
            Smaller than the images' sides.
        cutout_fill: the pixel (one uint8 value per channel) cutout writes.
        shuffle: bool, a new order of the images in each pass.
        seed: int or None (None: drawn once, so the run is consistent but not reproducible).
        drop_remainder: bool, drop the last incomplete batch of a pass
            (static batch shape for XLA).
        steps_per_epoch: int or None. None: one pass over the data per epoch;
            an int: epochs of that many batches cut from an endless sequence
            of passes.
        shard: (index, count), this process' slice of every batch in a run
            of `count` processes (Keras' distribution on JAX assembles the
            global batch from the processes' slices). Every process makes the
            whole batch and keeps its rows, so the global batch is the one a
            single process makes, augmentation included.
        **kwargs: `keras.utils.PyDataset` arguments (workers, ...).
    """

    def __init__(
        self,
        images,
        labels,
        *,
        batch_size,
        augment=False,
        shuffle=False,
        seed=None,
        drop_remainder=False,
        steps_per_epoch=None,
        shard=(0, 1),
        cutout=0,
        cutout_fill=(0, 0, 0),
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("batch_size", batch_size)
        check_positive_int("steps_per_epoch", steps_per_epoch, allow_none=True)
        index, count = shard
        if not 0 <= index < count or batch_size % count:
            raise ValueError(
                f"`shard` must be (index, count) with 0 <= index < count and a batch_size that "
                f"divides into count slices. Received: shard={shard!r}, batch_size={batch_size}"
            )
        self.shard = (index, count)
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(
                "`images` must be the raw pixels, a uint8 array (N, H, W, 3). "
                f"Received: images {images.dtype} {images.shape}"
            )
        self.images, self.labels = images, np.asarray(labels, "int64")
        if self.labels.shape != (len(images),):
            raise ValueError(
                f"`labels` must hold one class number per image, shape ({len(images)},). "
                f"Received: labels of shape {self.labels.shape} for {len(images)} images"
            )
        self.batch_size = batch_size
        full, remainder = divmod(len(self.images), batch_size)
        self.batches_per_pass = full if drop_remainder else full + bool(remainder)
        self.full_batches = drop_remainder or not remainder
        if self.batches_per_pass < 1:
            raise ValueError(
                f"The data holds {len(self.images)} images, fewer than one batch. Received: batch_size={batch_size}"
            )
        self.augment, self.shuffle = augment, shuffle
        self.cutout, self.cutout_fill = _checked_cutout(cutout, augment, images.shape[1:3]), np.uint8(cutout_fill)
        self.seed = int(np.random.SeedSequence().entropy % 2**32) if seed is None else int(seed)
        self.steps_per_epoch = steps_per_epoch
        self.epoch = 0
        self._order_cache = (None, None)

    def __len__(self):
        return self.steps_per_epoch or self.batches_per_pass

    def _order(self, data_pass):
        if self._order_cache[0] != data_pass:
            order = (
                np.random.default_rng([self.seed, data_pass]).permutation(len(self.images))
                if self.shuffle
                else np.arange(len(self.images))
            )
            self._order_cache = (data_pass, order)
        return self._order_cache[1]

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"Batch index {index} out of range [0, {len(self)}).")
        data_pass, batch = divmod(self.epoch * len(self) + index, self.batches_per_pass)
        rows = self._order(data_pass)[batch * self.batch_size : (batch + 1) * self.batch_size]
        images = self.images[rows]
        if self.augment:
            images = augment_batch(
                images, np.random.default_rng([self.seed, data_pass, batch]), self.cutout, self.cutout_fill
            )
        index, count = self.shard
        if count == 1:
            return images, self.labels[rows]
        size = len(rows) // count  # the last batch of a pass divides too: `plan.check_last_batch`
        part = slice(index * size, (index + 1) * size)
        return images[part], self.labels[rows][part]


def _checked_cutout(cutout, augment, image_size):
    """`cutout` if it is 0, or a square's side smaller than the images' (`image_size`) on augmented batches."""
    check_cutout(cutout, image_size)
    if cutout and not augment:
        raise ValueError(f"`cutout` is an augmentation: it needs augment=True. Received: cutout={cutout!r}")
    return int(cutout)


def augment_batch(images, rng, cutout=0, cutout_fill=0):
    """Zero-pads uint8 images (N, H, W, C) by `PAD`, crops each back at a random offset, flips half of them;
    with `cutout`, then cuts a square of that side out of each (`cut_out_squares`)."""
    count, height, width = images.shape[:3]
    padded = np.pad(images, ((0, 0), (PAD, PAD), (PAD, PAD), (0, 0)))
    top = rng.integers(0, 2 * PAD + 1, count)
    left = rng.integers(0, 2 * PAD + 1, count)
    flip = rng.random(count) < 0.5
    columns = np.where(flip[:, None], np.arange(width)[::-1], np.arange(width)) + left[:, None]
    rows = top[:, None] + np.arange(height)
    augmented = padded[np.arange(count)[:, None, None], rows[:, :, None], columns[:, None, :]]
    return cut_out_squares(augmented, cutout, cutout_fill, rng) if cutout else augmented


def cut_out_squares(images, size, fill, rng):
    """Cutout (DeVries and Taylor, 2017): sets a `size` x `size` square of each image (N, H, W, C) to `fill`.

    Each square is centered on a pixel drawn uniformly from the image, so a
    square near a border is cut by it and every pixel is as likely to be
    covered as in the paper's code. There the square is written after the
    normalisation, as zeros; here the batches hold raw pixels, so `fill` is
    the pixel the model normalises to about zero (its mean pixel, rounded).
    Writes into `images` and returns them.
    """
    count, height, width = images.shape[:3]
    top = rng.integers(0, height, count) - size // 2
    left = rng.integers(0, width, count) - size // 2
    rows, columns = np.arange(height), np.arange(width)
    in_rows = (rows >= top[:, None]) & (rows < top[:, None] + size)
    in_columns = (columns >= left[:, None]) & (columns < left[:, None] + size)
    images[in_rows[:, :, None] & in_columns[:, None, :]] = fill
    return images


def as_tf_dataset(batches):
    """`batches` as a ``tf.data.Dataset`` of known length, for tf.distribute (TensorFlow backend).

    Keras distributes a tf.data input over the workers of a
    ``MultiWorkerMirroredStrategy`` (it fails on a PyDataset there) and
    prefetches it in parallel. Each element is computed by the same
    ``batches[index]`` when the epoch's iterator asks for it, so it stays a
    function of (seed, epoch, index).
    """
    import tensorflow as tf

    images, labels = batches[0]
    # A static batch size where every batch is full: XLA then compiles the step once.
    batch = batches.batch_size if batches.full_batches else None
    signature = (tf.TensorSpec((batch, *images.shape[1:]), tf.uint8), tf.TensorSpec((batch,), tf.int64))

    def load(index):
        images, labels = tf.numpy_function(lambda i: batches[int(i)], [index], (tf.uint8, tf.int64))
        return tf.ensure_shape(images, signature[0].shape), tf.ensure_shape(labels, signature[1].shape)

    # One batch made ahead: a batch costs ~2 ms of NumPy, and tf.data's autotuned parallelism
    # competed with the training step for this machine's cores.
    return tf.data.Dataset.range(len(batches)).map(load).prefetch(1)


class EpochSync(keras.callbacks.Callback):
    """Sets each `ArrayBatches`' epoch at the start of every epoch of ``fit`` (resumed runs included)."""

    def __init__(self, *batches):
        super().__init__()
        self.batches = batches

    def on_epoch_begin(self, epoch, logs=None):
        for batches in self.batches:
            batches.epoch = epoch
