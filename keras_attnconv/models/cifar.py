"""CIFAR-10 and CIFAR-100 facts the models and the data share: class names and pixel statistics.

A leaf: it imports nothing of the package.
"""

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# Per-channel statistics of the training sets (pixels scaled to [0, 1]).
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
# The official code's normalisation (its train.py), for CIFAR-10 and CIFAR-100 alike: CIFAR-10's mean, and a
# std that is not the training set's (0.2023 vs 0.2470 for red), as widely copied CIFAR code has it.
OFFICIAL_MEAN, OFFICIAL_STD = CIFAR10_MEAN, (0.2023, 0.1994, 0.2010)
