"""training/gpu/cifar10_parts.py: the JPEG copy split, decoded and joined is a dataset `attnconv train` reads."""

import importlib.util
import io
from pathlib import Path

import numpy as np
from PIL import Image

from keras_attnconv.training.data import dataset_info

SCRIPT = Path(__file__).resolve().parents[2] / "training" / "gpu" / "cifar10_parts.py"
spec = importlib.util.spec_from_file_location("cifar10_parts", SCRIPT)
cifar10_parts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cifar10_parts)


def jpeg_copy(path, images_per_split):
    """A file in the JPEG copy's layout (`<split>_bytes`, `_offsets`, `_labels`, `class_names`); its images by split."""
    rng = np.random.default_rng(0)
    arrays, images = {"class_names": np.array(["cat", "dog", "frog"])}, {}
    for split, count in images_per_split.items():
        images[split] = rng.integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)
        files = []
        for image in images[split]:
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, format="JPEG", quality=75)
            files.append(np.frombuffer(buffer.getvalue(), np.uint8))
        arrays[f"{split}_bytes"] = np.concatenate(files)
        arrays[f"{split}_offsets"] = np.cumsum([0, *(len(f) for f in files)])
        arrays[f"{split}_labels"] = np.arange(count) % 3
    np.savez(path, **arrays)
    return images


def test_the_parts_decoded_and_joined_are_the_copy_s_images_as_a_dataset(tmp_path):
    jpeg_copy(tmp_path / "copy.npz", {"train": 4, "test": 2})
    cifar10_parts.main(["split", str(tmp_path / "copy.npz"), str(tmp_path / "parts")])
    for split in ("train", "test"):
        cifar10_parts.main(["decode", str(tmp_path / f"parts/{split}.npz"), str(tmp_path / f"{split}.npz")])
    cifar10_parts.main(["join", str(tmp_path / "train.npz"), str(tmp_path / "test.npz"), str(tmp_path / "c10.npz")])
    with np.load(tmp_path / "copy.npz") as source, np.load(tmp_path / "c10.npz") as joined:
        for split in ("train", "test"):
            offsets, raw = source[f"{split}_offsets"], source[f"{split}_bytes"]
            decoded = [
                np.asarray(Image.open(io.BytesIO(raw[a:b].tobytes()))) for a, b in zip(offsets[:-1], offsets[1:])
            ]
            np.testing.assert_array_equal(joined[f"x_{split}"], np.stack(decoded))  # Pillow's decoding, in order
            np.testing.assert_array_equal(joined[f"y_{split}"], source[f"{split}_labels"])
            assert joined[f"x_{split}"].dtype == np.uint8
    info = dataset_info(str(tmp_path / "c10.npz"))
    assert info.class_names == ("cat", "dog", "frog") and info.num_classes == 3 and info.image_size == 32
