"""`paired_accuracy_gain`: the gain of a change measured on the same images, and its paired standard error."""

import math

import numpy as np
import pytest

from keras_attnconv.analysis.paired_accuracy import paired_accuracy_gain


def test_the_gain_and_its_error_come_from_the_images_the_two_ways_disagree_on():
    # 100 images: 60 right both ways, 5 right only without the change, 15 only with it, 20 wrong both ways.
    without = np.array([1] * 60 + [1] * 5 + [0] * 15 + [0] * 20, bool)
    with_change = np.array([1] * 60 + [0] * 5 + [1] * 15 + [0] * 20, bool)
    result = paired_accuracy_gain(without, with_change)
    assert (result["without"], result["with"], result["examples"]) == (0.65, 0.75, 100)
    assert (result["right_only_without"], result["right_only_with"]) == (5, 15)
    assert result["gain"] == pytest.approx(0.10)
    # The per-image differences: 15 of +1, 5 of -1, 80 of 0; their mean's standard error.
    variance = (15 + 5) / 100 - 0.10**2
    assert result["gain_standard_error"] == pytest.approx(math.sqrt(variance / 100))
    # Far below the binomial error of either accuracy, which an unpaired comparison would have.
    assert result["gain_standard_error"] < math.sqrt(0.65 * 0.35 / 100)


def test_two_ways_that_agree_on_every_image_gain_nothing_with_no_error():
    right = np.array([True, False, True])
    assert paired_accuracy_gain(right, right)["gain"] == paired_accuracy_gain(right, right)["gain_standard_error"] == 0


@pytest.mark.parametrize("without, with_change", [([True], [True, False]), ([], []), ([[True]], [[True]])])
def test_arrays_of_other_images_are_refused_with_their_shapes(without, with_change):
    with pytest.raises(ValueError, match="Received: shapes"):
        paired_accuracy_gain(without, with_change)
