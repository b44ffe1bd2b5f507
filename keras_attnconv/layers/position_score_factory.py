"""`get_position_score`: a position score layer from a name, a config or an instance; whether it fits an attention."""

import keras

from keras_attnconv.layers.gaussian_score import GaussianScore
from keras_attnconv.layers.learned_relative_score import LearnedRelativeScore
from keras_attnconv.layers.position_score import PositionScore
from keras_attnconv.layers.quadratic_score import QuadraticScore
from keras_attnconv.layers.siren_score import SirenScore
from keras_attnconv.utils.checks import check_choice, check_registered_name

#: The position scores by name: the one list that `RelativeMultiHeadAttention`, `AttentionClassifier` and
#: `build_model(..., position_score=name)` take a name from. A new score is a `PositionScore` subclass
#: registered with `register_position_score`, wherever it is defined.
POSITION_SCORES = {
    "quadratic": QuadraticScore,
    "gaussian": GaussianScore,
    "learned": LearnedRelativeScore,
    "siren": SirenScore,
}


def register_position_score(name, score_class):
    """Registers the `PositionScore` subclass `score_class` as `name`, for every attention and model config.

    Args:
        name: lower-case letters, digits and underscores, starting with a letter; not registered yet.
        score_class: a `PositionScore` subclass (register it with Keras too,
            ``keras.saving.register_keras_serializable``, so that models holding it reload).

    Returns:
        `score_class`.
    """
    check_registered_name("name", name)
    if name in POSITION_SCORES:
        raise ValueError(
            f"A position score is registered as {name!r} already ({POSITION_SCORES[name].__name__}). "
            f"Received: name={name!r}"
        )
    if not (isinstance(score_class, type) and issubclass(score_class, PositionScore)):
        raise ValueError(f"`score_class` must be a PositionScore subclass. Received: score_class={score_class!r}")
    POSITION_SCORES[name] = score_class
    return score_class


def position_score_class(name):
    """The `PositionScore` subclass registered as `name` in `POSITION_SCORES`; another name: a ValueError naming it."""
    names = sorted(POSITION_SCORES)
    if not isinstance(name, str):  # None or a number: no name to suggest one close to
        raise ValueError(
            f"`position_score` must be one of {', '.join(map(repr, names))}. Received: position_score={name!r}"
        )
    check_choice("position_score", name, names)
    return POSITION_SCORES[name]


def get_position_score(identifier, num_heads, key_dim=None, **kwargs):
    """Returns a position score layer from a name, a config dict or an instance.

    Args:
        identifier: a name of `POSITION_SCORES`, a `PositionScore` instance
            (returned as is) or a serialized layer dict.
        num_heads: int, used when building from a name.
        key_dim: int or None, the query/key width of the attention the score
            serves: the default encoding width of scores that need one (the
            learned encoding's ``embedding_dim``); used when building from a name.
        **kwargs: extra constructor arguments when building from a name
            (``"gaussian"`` also takes ``diagonal=True`` for `DiagonalGaussianScore`).
    """
    if isinstance(identifier, PositionScore):
        return identifier
    if isinstance(identifier, dict):
        layer = keras.saving.deserialize_keras_object(identifier)
        if not isinstance(layer, PositionScore):
            raise ValueError(f"`position_score` config does not describe a PositionScore. Received: {identifier}")
        return layer
    if isinstance(identifier, str):
        return position_score_class(identifier).from_arguments(num_heads, key_dim=key_dim, **kwargs)
    raise ValueError(
        f"`position_score` must be a name, a PositionScore layer or its config. Received: position_score={identifier!r}"
    )


def check_score_fits_attention(layer, num_heads, use_position_bias):
    """ValueError unless a position score `layer` fits an attention of `num_heads` heads (and position bias or not)."""
    if layer.num_heads != num_heads:
        raise ValueError(
            f"`position_score` must have the attention's heads (num_heads={num_heads}). "
            f"Received: position_score {type(layer).__name__} with num_heads={layer.num_heads}"
        )
    if layer.head_vectors != use_position_bias:
        raise ValueError(
            f"`position_score` must have per-head vectors v (head_vectors) exactly where the attention uses the "
            f"position-bias term they make (use_position_bias={use_position_bias}). Received: position_score "
            f"{type(layer).__name__} with head_vectors={layer.head_vectors}"
        )
