"""Argument checks for every level of the package, with Keras-style messages ("... Received: name=value").

Pure Python: its checks use no framework (importing the package still loads Keras).
"""

import dataclasses
import difflib
import math
import numbers
import os
import re
from pathlib import Path

# How much less alike than the closest name a suggestion may be: beside a near-certain typo's correction
# ('numerics' for 'numeric', 0.93), a name that merely shares letters ('clusters', 0.4) only misleads.
_SUGGESTION_MARGIN = 0.3


def closest_names(name, candidates):
    """Names in `candidates` closest to `name`, for 'did you mean' messages: up to three, none much less alike
    than the closest."""
    matches = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=3, cutoff=0.3)
    ratios = [difflib.SequenceMatcher(None, str(name), match).ratio() for match in matches]
    return [match for match, ratio in zip(matches, ratios) if ratio >= ratios[0] - _SUGGESTION_MARGIN]


def did_you_mean(name, candidates):
    """`` Did you mean 'x'?`` for the closest candidates, or an empty string."""
    suggestions = closest_names(name, candidates)
    return f" Did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""


def plain_numbers(instance):
    """Gives the fields of a (frozen) dataclass that hold NumPy numbers Python's ``int`` and ``float`` instead.

    NumPy scalars are valid numbers for the checks, but a config must stay
    JSON-serializable (``config.json``, ``get_config``); booleans stay as they are.
    """
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if isinstance(value, (bool, int, float)) or not isinstance(value, numbers.Real):
            continue
        object.__setattr__(instance, field.name, int(value) if isinstance(value, numbers.Integral) else float(value))


def check_known_fields(values, fields, source):
    """Raises ValueError naming the first key of `values` not in `fields` (with the closest ones and all of them)."""
    for key in values:
        if key not in fields:
            raise ValueError(
                f"Unknown {source} field {key!r}.{did_you_mean(key, fields)} "
                f"Valid fields: {', '.join(sorted(fields))}. Received: {key}={values[key]!r}"
            )


def check_positive_int(name, value, allow_none=False):
    """Raises ValueError naming `name` unless `value` is an integer >= 1 (or None when allowed)."""
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        expected = "None or a positive integer" if allow_none else "a positive integer"
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")


def check_real(name, value, low=-math.inf, high=math.inf, low_open=False, high_open=False):
    """Raises ValueError naming `name` unless `value` is a finite real number in the given interval."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        raise ValueError(
            f"`{name}` must be a finite number{_bounds(low, high, low_open, high_open)}. Received: {name}={value!r}"
        )


def _bounds(low, high, low_open, high_open):
    """`` in [0.0, 1.0)``, `` > 0.0``, `` <= 1.0`` or nothing: the interval, with no infinite end in it."""
    if math.isfinite(low) and math.isfinite(high):
        return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if math.isfinite(low):
        return f" {'>' if low_open else '>='} {low}"
    if math.isfinite(high):
        return f" {'<' if high_open else '<='} {high}"
    return ""


def check_rate(name, value):
    """Raises ValueError naming `name` unless `value` is a real number in [0, 1) (a dropout rate)."""
    check_real(name, value, 0.0, 1.0, high_open=True)


def check_positive_number(name, value):
    """Raises ValueError naming `name` unless `value` is a finite real number > 0."""
    check_real(name, value, low=0.0, low_open=True)


def check_bool(name, value):
    """Raises ValueError naming `name` unless `value` is True or False (not a string such as "maybe")."""
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be true or false. Received: {name}={value!r}")


def check_seed(name, value):
    """Raises ValueError naming `name` unless `value` is None or an integer seed in [0, 2**32) (Keras' and NumPy's)."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < 2**32
    ):
        raise ValueError(f"`{name}` must be None or an integer in [0, 2**32). Received: {name}={value!r}")


def check_choice(name, value, choices):
    """Raises ValueError naming `name` unless `value` is one of `choices` (suggesting the closest)."""
    if value not in choices:
        raise ValueError(
            f"`{name}` must be one of {', '.join(map(repr, choices))}."
            f"{did_you_mean(value, choices)} Received: {name}={value!r}"
        )


#: A name the package registers (a model, a position score): also a directory and a TF Serving model name.
_REGISTERED_NAME = re.compile(r"[a-z][a-z0-9_]*")


def check_registered_name(name, value):
    """Raises ValueError naming `name` unless `value` is lower-case letters, digits and underscores, starting
    with a letter."""
    if not isinstance(value, str) or not _REGISTERED_NAME.fullmatch(value):
        raise ValueError(
            f"`{name}` must be lower-case letters, digits and underscores, starting with a letter. "
            f"Received: {name}={value!r}"
        )


#: How a value that can be omitted is omitted on the command line and in a recipe (TOML has no null).
NONE_WORDS = ("none", "null")


def none_word(value):
    """None for a string that says none (`NONE_WORDS`, any case), else `value`: the one parser of omitted values."""
    return None if isinstance(value, str) and value.strip().lower() in NONE_WORDS else value


#: The longest name (path component) the package accepts: a file system's limit is 255 bytes, and an owner
#: stages a directory under a hidden name that adds about 40 characters to it.
MAX_NAME_BYTES = 200


def check_path(argument, path):
    """Raises ValueError naming `argument` unless `path` is a path the system can take: before any work.

    No NUL byte (no system call takes one) and no name longer than
    `MAX_NAME_BYTES`; the one check of both, for every path and name given.
    """
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text:
        raise ValueError(f"`{argument}` must be a non-empty path. Received: {argument}={path!r}")
    if "\0" in text:
        raise ValueError(f"`{argument}` cannot hold a NUL byte. Received: {argument}={text!r}")
    longest = max(Path(text).parts, key=lambda part: len(part.encode(errors="surrogateescape")), default="")
    if len(longest.encode(errors="surrogateescape")) > MAX_NAME_BYTES:
        shown = f"{text[:60]}...({len(text)} characters)"
        raise ValueError(
            f"`{argument}` has a name of {len(longest)} characters; at most {MAX_NAME_BYTES} bytes are "
            f"allowed. Received: {argument}={shown!r}"
        )
    return path
