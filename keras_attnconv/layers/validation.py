"""Shape and dtype checks of the layers, with Keras-style messages."""

import keras

#: The most memory one tensor (a weight, a table, one image's activations or scores) may take: a size
#: beyond it is taken for a mistake and refused before anything is allocated, instead of a long wait
#: and an out-of-memory error that names nothing. An H100 holds about 80 GiB; the paper's largest
#: model holds 0.12 GiB of weights.
MAX_TENSOR_BYTES = 8 * 2**30


def check_tensor_bytes(what, num_bytes, received):
    """Raises ValueError naming `received` (the arguments that size it) if `what` needs more than `MAX_TENSOR_BYTES`."""
    if num_bytes > MAX_TENSOR_BYTES:
        raise ValueError(
            f"{what} would take about {num_bytes / 2**30:.3g} GiB, more than the "
            f"{MAX_TENSOR_BYTES / 2**30:g} GiB limit that catches a size given by mistake "
            f"(keras_attnconv.layers.validation.MAX_TENSOR_BYTES). Received: {received}"
        )


def get_initializer(name, value):
    """``keras.initializers.get(value)``, an unknown identifier being a ValueError naming the argument `name`."""
    return _keras_object(keras.initializers.get, "a Keras initializer", name, value)


def independent(initializer):
    """`initializer` for one more weight: a copy with a seed of its own when it is unseeded.

    An unseeded Keras initializer draws its seed once, when it is made, and repeats
    the same values at every call (Keras' documentation), so weights that share one
    instance would start equal (two blocks' kernels, a row table and its column
    table) or as prefixes of each other. Seeded initializers are the user's
    choice and are returned as they are.
    """
    config = initializer.get_config()
    if "seed" in config and config["seed"] is None:
        return type(initializer).from_config(config)
    return initializer


def get_activation(name, value):
    """``keras.activations.get(value)``, an unknown identifier being a ValueError naming the argument `name`."""
    return _keras_object(keras.activations.get, "a Keras activation", name, value)


def _keras_object(get, what, name, value):
    try:
        return get(value)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be {what} or its name. Received: {name}={value!r}") from None


def real_inputs(inputs, compute_dtype):
    """`inputs` cast to `compute_dtype`; a complex input is refused (a cast would drop its imaginary part)."""
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    if dtype.startswith("complex"):
        raise ValueError(
            f"The inputs must be real numbers (a cast would drop the imaginary part). Received: inputs of dtype {dtype}"
        )
    return keras.ops.cast(inputs, compute_dtype)


def grid_size(input_shape):
    """Returns the static (height, width) of a (batch, H, W, C) shape, or raises."""
    input_shape = tuple(input_shape)
    if len(input_shape) != 4:
        raise ValueError(f"Expected a 4-D input (batch, height, width, channels). Received: input_shape={input_shape}")
    height, width = input_shape[1], input_shape[2]
    if height is None or width is None:
        raise ValueError(
            "Height and width of the input must be known when the layer is built "
            f"(attention over pixels needs static shapes). Received: input_shape={input_shape}"
        )
    return int(height), int(width)
