"""The images a dataset without splits holds out for evaluation: the same ones every time.

A folder of images with no split folders (`image_folder`) and a ``.npz`` with
only ``x``/``y`` (`data`) are split the same way: `HELD_OUT_FRACTION` of each
class goes to ``"test"``, at least one image of a class of two or more, the
images ranked by a digest of `SPLIT_SEED` and the image's key (its path in a
folder, its position in a ``.npz``). So the split is the same every time, and
adding an image moves few others.
"""

import hashlib

import numpy as np

HELD_OUT_FRACTION = 0.1  # of each class, held out as "test" (at least 1 of a class of 2 or more)
SPLIT_SEED = "keras_attnconv held-out v1"
SPLITS = ("test", "train")  # what a dataset without splits is split into


def held_out_mask(keys, labels):
    """A boolean array: whether each image (its `keys[i]`, of class `labels[i]`) is held out as ``"test"``."""
    labels = np.asarray(labels)
    held = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        count = max(1, round(HELD_OUT_FRACTION * len(members))) if len(members) > 1 else 0
        ranked = sorted(members, key=lambda i: hashlib.sha256(f"{SPLIT_SEED}\0{keys[i]}".encode()).hexdigest())
        held[ranked[:count]] = True
    return held
