"""Writes keras_attnconv/training/assets/cifar10_sample.npz: the embedded real CIFAR-10 sample.

Usage (from the repository root):
    python training/make_cifar10_sample.py ../shared/data/cifar10_subset_train.npz

Takes the first 300 images of each class (class-balanced, 3,000 images, 9.2 MB of
pixels) and splits them 250 / 50 per class into `train` and `validation`.
"""

import sys
from pathlib import Path

import numpy as np

PER_CLASS_TRAIN, PER_CLASS_VALIDATION = 250, 50


def main(source):
    data = np.load(source)
    x, y = data["x"], data["y"].astype("int64")
    train, validation = [], []
    for label in range(10):
        index = np.flatnonzero(y == label)[: PER_CLASS_TRAIN + PER_CLASS_VALIDATION]
        train.append(index[:PER_CLASS_TRAIN])
        validation.append(index[PER_CLASS_TRAIN:])
    train, validation = np.sort(np.concatenate(train)), np.sort(np.concatenate(validation))
    out = Path(__file__).resolve().parents[1] / "keras_attnconv" / "training" / "assets" / "cifar10_sample.npz"
    np.savez_compressed(out, x_train=x[train], y_train=y[train], x_validation=x[validation], y_validation=y[validation])
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): {len(train)} train, {len(validation)} validation")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/cifar10_subset_train.npz")
