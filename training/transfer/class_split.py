"""CIFAR-10 cut in two by class, for a fine-tuning experiment: pre-train on some classes, fine-tune on the others.

::

    # the full CIFAR-10 JPEG copy decoded into one .npz (x_train, y_train, x_test, y_test, class_names)
    python training/gpu/cifar10_parts.py split ../shared/data/cifar10_jpeg.npz runs/parts
    python training/gpu/cifar10_parts.py decode runs/parts/train.npz runs/parts/train-images.npz
    python training/gpu/cifar10_parts.py decode runs/parts/test.npz runs/parts/test-images.npz
    python training/gpu/cifar10_parts.py join runs/parts/train-images.npz runs/parts/test-images.npz runs/cifar10.npz
    # OUT/pretrain.npz: classes 0-4, every image; OUT/finetune.npz: classes 5-9, 200 training images each
    python training/transfer/class_split.py runs/cifar10.npz runs/transfer --pretrain-classes 5 --per-class 200

Each output is a dataset .npz of `attnconv train --dataset`: its labels numbered from 0 and its
``class_names`` those of its classes. The fine-tuning set keeps every test image of its classes and
the first `per_class` training images of each (in the source's order), so that its runs are judged on
many images but learn from few, where what was pre-trained can show.
"""

import argparse
from pathlib import Path

import numpy as np


def subset(data, classes, per_class=None):
    """The arrays of `data` for `classes` (relabelled 0, 1, ... in that order), at most `per_class` training images
    of each."""
    arrays = {"class_names": np.asarray(data["class_names"])[classes]}
    for split in ("train", "test"):
        labels = data[f"y_{split}"]
        chosen = []
        for label in classes:
            indices = np.flatnonzero(labels == label)
            chosen.append(indices[:per_class] if split == "train" and per_class else indices)
        indices = np.sort(np.concatenate(chosen))
        arrays[f"x_{split}"] = data[f"x_{split}"][indices]
        arrays[f"y_{split}"] = np.searchsorted(classes, labels[indices]).astype(np.int64)
    return arrays


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a dataset .npz with x_train, y_train, x_test, y_test and class_names")
    parser.add_argument("output", help="the directory of pretrain.npz and finetune.npz")
    parser.add_argument("--pretrain-classes", type=int, default=5, help="the first N classes are pre-trained on")
    parser.add_argument("--per-class", type=int, default=200, help="training images of each fine-tuning class")
    args = parser.parse_args(argv)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    with np.load(args.source, allow_pickle=False) as data:
        classes = np.arange(len(data["class_names"]))
        np.savez(output / "pretrain.npz", **subset(data, classes[: args.pretrain_classes]))
        np.savez(output / "finetune.npz", **subset(data, classes[args.pretrain_classes :], per_class=args.per_class))


if __name__ == "__main__":
    main()
