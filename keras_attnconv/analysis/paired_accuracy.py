"""Two ways of classifying the same images compared image by image: the gain in accuracy and its standard error."""

import math

import numpy as np


def paired_accuracy_gain(right_without, right_with):
    """What a change gains in accuracy, from which images each way classified right (two boolean arrays, one per image).

    The gain is ``mean(right_with) - mean(right_without)`` and its standard
    error that of the mean of the per-image differences (each -1, 0 or 1):
    only the images the two ways disagree on count, so a change measured on
    the same images and weights is resolved far below the accuracies' own
    binomial errors.

    Returns:
        dict with ``without`` and ``with`` (the accuracies), ``gain``,
        ``gain_standard_error``, ``right_only_without`` and ``right_only_with``
        (the images only one way classified right) and ``examples``.
    """
    right_without, right_with = np.asarray(right_without, bool), np.asarray(right_with, bool)
    if right_without.shape != right_with.shape or right_without.ndim != 1 or not right_without.size:
        raise ValueError(
            "`right_without` and `right_with` must say of the same images (one boolean each) whether they were "
            f"classified right. Received: shapes {right_without.shape} and {right_with.shape}"
        )
    differences = right_with.astype(np.float64) - right_without
    examples = differences.size
    return {
        "without": float(right_without.mean()),
        "with": float(right_with.mean()),
        "gain": float(differences.mean()),
        "gain_standard_error": float(differences.std() / math.sqrt(examples)),
        "right_only_without": int((differences < 0).sum()),
        "right_only_with": int((differences > 0).sum()),
        "examples": examples,
    }
