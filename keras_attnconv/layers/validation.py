"""Shape checks of the layers, with Keras-style messages."""

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
