"""Checks of config fields and build arguments with messages that name the field and the value."""

import keras

from keras_attnconv.layers.validation import check_tensor_bytes
from keras_attnconv.models.precision import check_policy_name
from keras_attnconv.utils.checks import check_bool, check_positive_int, check_positive_number, check_rate


def check_config_fields(config, positive=(), rates=(), positive_numbers=(), optional_positive=(), bools=()):
    """Raises ValueError naming the first field of `config` that is out of range.

    Args:
        config: the config object (fields are read as attributes).
        positive: fields that must be integers >= 1.
        rates: fields that must be real numbers in [0, 1) (dropout rates).
        positive_numbers: fields that must be finite real numbers > 0.
        optional_positive: fields that are None (a default) or integers >= 1.
        bools: fields that are True or False (a string such as "false" is refused).
    """
    for field in positive:
        check_positive_int(field, getattr(config, field))
    for field in optional_positive:
        if getattr(config, field) is not None:
            check_positive_int(field, getattr(config, field))
    for field in rates:
        check_rate(field, getattr(config, field))
    for field in positive_numbers:
        check_positive_number(field, getattr(config, field))
    for field in bools:
        check_bool(field, getattr(config, field))


def check_sizes(config, tensors):
    """Raises ValueError naming the fields that size the first of `tensors` beyond `MAX_TENSOR_BYTES`.

    Args:
        config: the config object (fields are read as attributes).
        tensors: ``(what, fields, num_elements)`` of the largest float32 tensors the model would hold
            or compute per image, estimated from the config alone: the check runs before any allocation.
    """
    for what, fields, num_elements in tensors:
        check_tensor_bytes(what, 4 * num_elements, ", ".join(f"{f}={getattr(config, f)!r}" for f in fields))


def dtype_policy(dtype):
    """The `keras.DTypePolicy` a model is built with: `dtype` checked, None meaning Keras' global policy.

    `dtype` is a policy name of `keras_attnconv.models.precision.POLICY_NAMES` (``"float32"``,
    ``"mixed_bfloat16"``, ``"bfloat16"``, ...) or a `keras.DTypePolicy` whose compute and
    variable dtypes are floating point; anything else (an unknown name, an integer or
    quantized policy) is a ValueError naming it. Training runs take fewer (`precision`).
    """
    if dtype is None:
        return keras.dtype_policies.get(None)
    if isinstance(dtype, str):
        check_policy_name(dtype)
        return keras.DTypePolicy(dtype)
    if (
        not isinstance(dtype, keras.DTypePolicy)
        or dtype.quantization_mode is not None
        or not all(keras.backend.is_float_dtype(d) for d in (dtype.compute_dtype, dtype.variable_dtype))
    ):
        raise ValueError(
            "`dtype` must be None, a floating-point dtype policy name such as 'float32', "
            "'mixed_float16', 'mixed_bfloat16' or 'bfloat16', or a keras.DTypePolicy of floating "
            f"compute and variable dtypes. Received: dtype={dtype!r}"
        )
    return dtype
