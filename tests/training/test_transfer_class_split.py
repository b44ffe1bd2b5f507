"""training/transfer/class_split.py: a dataset cut in two by class is two datasets `attnconv train` reads, the
second with few training images of each class and every test image."""

import importlib.util
from pathlib import Path

import numpy as np

from keras_attnconv.training.data import dataset_info

SCRIPT = Path(__file__).resolve().parents[2] / "training" / "transfer" / "class_split.py"
spec = importlib.util.spec_from_file_location("class_split", SCRIPT)
class_split = importlib.util.module_from_spec(spec)
spec.loader.exec_module(class_split)


def test_the_classes_are_cut_in_two_relabelled_and_the_second_part_keeps_few_training_images(tmp_path):
    # Image i of a split is filled with i: which images were kept is read back from the pixels.
    labels = {"train": np.array([3, 0, 1, 2, 3, 0, 2, 3]), "test": np.array([2, 3, 0, 1, 3])}
    arrays = {f"y_{split}": y for split, y in labels.items()}
    for split, y in labels.items():
        arrays[f"x_{split}"] = np.arange(len(y), dtype=np.uint8)[:, None, None, None] * np.ones((1, 4, 4, 3), np.uint8)
    np.savez(tmp_path / "source.npz", **arrays, class_names=np.array(["a", "b", "c", "d"]))
    class_split.main(
        [str(tmp_path / "source.npz"), str(tmp_path / "out"), "--pretrain-classes", "2", "--per-class", "1"]
    )

    pretrain, finetune = (np.load(tmp_path / "out" / f"{name}.npz") for name in ("pretrain", "finetune"))
    assert list(pretrain["class_names"]) == ["a", "b"] and list(finetune["class_names"]) == ["c", "d"]
    # Every image of the first classes, in the source's order.
    assert list(pretrain["x_train"][:, 0, 0, 0]) == [1, 2, 5] and list(pretrain["y_train"]) == [0, 1, 0]
    assert list(pretrain["x_test"][:, 0, 0, 0]) == [2, 3] and list(pretrain["y_test"]) == [0, 1]
    # The first training image of each other class (c: image 3, d: image 0), relabelled from 0; every test image.
    assert list(finetune["x_train"][:, 0, 0, 0]) == [0, 3] and list(finetune["y_train"]) == [1, 0]
    assert list(finetune["x_test"][:, 0, 0, 0]) == [0, 1, 4] and list(finetune["y_test"]) == [0, 1, 1]
    info = dataset_info(str(tmp_path / "out" / "finetune.npz"))
    assert (info.num_classes, info.class_names) == (2, ("c", "d"))
