"""The package's data files, found by path: the training floor ships them, the benchmarks read them too."""

from pathlib import Path

# Real CIFAR-10 images (uint8 NHWC) with x_train/y_train and x_validation/y_validation: the default data of
# `attnconv train`, and the real images the format benchmark compares its runtimes on.
SAMPLE_PATH = Path(__file__).parents[1] / "training" / "assets" / "cifar10_sample.npz"
