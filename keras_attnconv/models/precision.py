"""Which dtype policies the package takes: one rule for models and for training runs.

A model (`build_model(..., dtype=...)`, a preset, a config's ``build``) takes
any floating-point Keras policy: a name in `POLICY_NAMES`, or a
`keras.DTypePolicy` whose compute and variable dtypes are floating point.
A training run (``precision`` of a recipe, ``attnconv train --precision``)
takes the policies among them that keep float32 variables, `PRECISIONS`:
SGD's small updates are lost when added to 16-bit weights (a step of
``lr * grad`` below 2^-8 of a bfloat16 weight leaves it unchanged), so the
16-bit policies are for inference, and float64 is not a training precision
either (no accelerator runs it at speed).

Its checks use no framework's computation, so a recipe is checked before any model is built.
"""

from keras_attnconv.utils.checks import did_you_mean

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
MIXED_POLICIES = ("mixed_bfloat16", "mixed_float16")
POLICY_NAMES = FLOAT_DTYPES + MIXED_POLICIES


def variable_dtype(policy_name):
    """The dtype of the weights under a policy of `POLICY_NAMES` (Keras' rule: mixed policies keep float32)."""
    return "float32" if policy_name in MIXED_POLICIES else policy_name


PRECISIONS = tuple(name for name in POLICY_NAMES if variable_dtype(name) == "float32")


def check_policy_name(name, argument="dtype"):
    """Raises ValueError naming `argument` unless `name` is one of `POLICY_NAMES`."""
    if name not in POLICY_NAMES:
        raise ValueError(
            f"`{argument}` must be a floating-point dtype policy: one of "
            f"{', '.join(map(repr, POLICY_NAMES))}.{did_you_mean(name, POLICY_NAMES)} "
            f"Received: {argument}={name!r}"
        )


def check_precision(precision, argument="precision"):
    """Raises ValueError naming `argument` unless a run can train in `precision` (one of `PRECISIONS`)."""
    check_policy_name(precision, argument)
    if precision not in PRECISIONS:
        raise ValueError(
            f"`{argument}` must keep float32 weights to train: one of "
            f"{', '.join(map(repr, PRECISIONS))} ({precision!r} is a model dtype for inference: "
            f"build_model(..., dtype={precision!r})). Received: {argument}={precision!r}"
        )


def check_precisions(precisions, argument="precisions"):
    """Raises ValueError naming `argument` unless `precisions` is a non-empty sequence of `PRECISIONS`, each once."""
    if not precisions or len(set(precisions)) != len(precisions):
        raise ValueError(
            f"`{argument}` must name each training precision to measure once: some of "
            f"{', '.join(map(repr, PRECISIONS))}. Received: {argument}={','.join(precisions)!r}"
        )
    for precision in precisions:
        check_precision(precision, argument)
