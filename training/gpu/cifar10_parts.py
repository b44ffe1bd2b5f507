"""The full CIFAR-10 JPEG copy in parts that travel to a lent GPU machine, and its images decoded there.

A lent GPU machine receives at most 64 MiB a call, the project's files included: the JPEG copy
(56 MB) goes in two calls, its training images in one and its test images in the next, and is
decoded on the machine into the .npz that `attnconv train --dataset` reads::

    # here: PARTS/train.npz (46 MB of JPEG bytes) and PARTS/test.npz (9 MB)
    python training/gpu/cifar10_parts.py split ../shared/data/cifar10_jpeg.npz runs/gpu-parts
    # there (Pillow, NumPy): x_train, y_train, x_test, y_test as uint8 images and int64 labels, class_names
    python3 training/gpu/cifar10_parts.py decode runs/gpu-parts/train.npz /tmp/cifar10-train.npz
    python3 training/gpu/cifar10_parts.py decode runs/gpu-parts/test.npz /tmp/cifar10-test.npz
    python3 training/gpu/cifar10_parts.py join /tmp/cifar10-train.npz /tmp/cifar10-test.npz /tmp/cifar10.npz

The source holds ``<split>_bytes``, ``<split>_offsets`` and ``<split>_labels`` (image i is the JPEG file
``bytes[offsets[i]:offsets[i+1]]``) and ``class_names``; results on it are "CIFAR-10 (JPEG copy)".
"""

import argparse
import io
import sys

import numpy as np

SPLITS = ("train", "test")


def split(source, parts):
    """Writes ``parts/<split>.npz`` for each split of the JPEG copy: its bytes, offsets, labels and the class names."""
    import pathlib

    pathlib.Path(parts).mkdir(parents=True, exist_ok=True)
    with np.load(source, allow_pickle=False) as data:
        for name in SPLITS:
            arrays = {key: data[f"{name}_{key}"] for key in ("bytes", "offsets", "labels")}
            np.savez(f"{parts}/{name}.npz", split=np.array(name), class_names=data["class_names"], **arrays)


def decode(part, output):
    """Decodes one part's JPEG images into ``x_<split>`` (N, 32, 32, 3) uint8 and ``y_<split>`` int64."""
    from PIL import Image

    with np.load(part, allow_pickle=False) as data:
        name, raw, offsets = str(data["split"]), data["bytes"], data["offsets"]
        images = np.stack(
            [
                np.asarray(Image.open(io.BytesIO(raw[start:end].tobytes())).convert("RGB"))
                for start, end in zip(offsets[:-1], offsets[1:])
            ]
        )
        np.savez(
            output,
            **{f"x_{name}": images, f"y_{name}": data["labels"].astype("int64")},
            class_names=data["class_names"],
        )


def join(train, test, output):
    """One .npz of both decoded splits."""
    with np.load(train, allow_pickle=False) as first, np.load(test, allow_pickle=False) as second:
        arrays = {key: first[key] for key in first.files} | {key: second[key] for key in second.files}
    np.savez(output, **arrays)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("split").add_argument("paths", nargs=2, metavar=("SOURCE", "PARTS_DIR"))
    commands.add_parser("decode").add_argument("paths", nargs=2, metavar=("PART", "OUTPUT"))
    commands.add_parser("join").add_argument("paths", nargs=3, metavar=("TRAIN", "TEST", "OUTPUT"))
    arguments = parser.parse_args(argv)
    {"split": split, "decode": decode, "join": join}[arguments.command](*arguments.paths)


if __name__ == "__main__":
    sys.exit(main())
