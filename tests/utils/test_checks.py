"""The argument checks' errors name the argument, the interval it must lie in (never an infinite end), and the value."""

import math

import pytest

from keras_attnconv.utils.checks import check_real, closest_names


@pytest.mark.parametrize(
    "bounds, value, message",
    [
        ({"low": 0.0, "high": 1.0, "high_open": True}, 1.0, r"`rate` must be a finite number in \[0.0, 1.0\)\. "),
        ({"low": 0.0, "low_open": True}, 0.0, r"`rate` must be a finite number > 0.0\. "),
        ({"low": 0.0}, -1.0, r"`rate` must be a finite number >= 0.0\. "),
        ({"high": 2.0, "high_open": True}, 3.0, r"`rate` must be a finite number < 2.0\. "),
        ({}, math.inf, r"`rate` must be a finite number\. "),
        ({"low": 0.0}, math.nan, r"`rate` must be a finite number >= 0.0\. Received: rate=nan$"),
        ({}, "0.5", r"`rate` must be a finite number\. Received: rate='0.5'$"),
    ],
)
def test_a_value_outside_its_interval_is_refused_with_the_interval_and_the_value(bounds, value, message):
    with pytest.raises(ValueError, match=message):
        check_real("rate", value, **bounds)


@pytest.mark.parametrize("value", [0.0, 0.5, 1e300])
def test_a_value_inside_its_interval_passes(value):
    check_real("rate", value, low=0.0)


def test_a_near_certain_correction_is_suggested_without_names_that_merely_share_letters():
    suites = ["cpu", "gpu", "numerics", "formats", "steps", "clusters", "scale", "profile", "plan"]
    assert closest_names("numeric", suites) == ["numerics"]  # 'clusters' shares letters, 0.4 alike against 0.93
    assert closest_names("resnet", ["resnet18", "resnet10", "resnet_tiny", "quadratic"]) == [
        "resnet18",
        "resnet10",
        "resnet_tiny",
    ]  # as alike, or nearly: all of them
    assert closest_names("zzz", suites) == []
