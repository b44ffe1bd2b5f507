"""Argument and shape checks shared by the package, with Keras-style messages."""

import difflib

import numpy as np


def check_positive_int(name, value):
    """Raises ValueError naming `name` unless `value` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def grid_size(input_shape):
    """Returns the static (height, width) of a (batch, H, W, C) shape, or raises."""
    input_shape = tuple(input_shape)
    if len(input_shape) != 4:
        raise ValueError(
            "Expected a 4-D input (batch, height, width, channels). "
            f"Received: input_shape={input_shape}"
        )
    height, width = input_shape[1], input_shape[2]
    if height is None or width is None:
        raise ValueError(
            "Height and width of the input must be known when the layer is built "
            f"(attention over pixels needs static shapes). Received: input_shape={input_shape}"
        )
    return int(height), int(width)


def closest_names(name, candidates):
    """Names in `candidates` closest to `name`, for 'did you mean' messages."""
    return difflib.get_close_matches(str(name), list(candidates), n=3, cutoff=0.3)
