"""`RelativeMultiHeadAttention._compute_attention`: the one hook of the attention computation.

A subclass that overrides it (here: scores divided by a temperature) changes the attention of
every path the layer takes: the global "content" and "position" paths call it, and such a
layer never takes the separable or windowed paths, which compute the default attention only.
"""

import numpy as np
import pytest
from keras import ops
from support import np_softmax, randomize_weights

from keras_attnconv.layers import RelativeMultiHeadAttention
from keras_attnconv.layers.attention_paths import attention_scores, contract_heads

HEADS, SHAPE = 2, (2, 8, 8, 4)  # a grid where "auto" would take the windowed path
TEMPERATURE = 2.0


class TemperatureAttention(RelativeMultiHeadAttention):
    """Softmax of the scores divided by a temperature, without dropout."""

    def _compute_attention(self, queries, keys, values, score_terms, attention_mask=None, training=None):
        scores = attention_scores(queries, keys, score_terms, attention_mask) / TEMPERATURE
        probabilities = ops.softmax(scores, axis=-1)
        return contract_heads(ops.cast(probabilities, values.dtype), values, self.output_kernel), probabilities


def full_probabilities(scores, tokens):
    """Returned attention scores as (batch, heads, T, T): a window's entries are placed at their keys."""
    if not isinstance(scores, tuple):
        return ops.convert_to_numpy(scores).astype("float64")
    window, key_indices = (ops.convert_to_numpy(t) for t in scores)
    full = np.zeros((*window.shape[:3], tokens))
    np.put_along_axis(full, np.broadcast_to(key_indices, window.shape), window, axis=-1)
    return full


CASES = {  # the base layer's path (forced) on the test grid; the subclass ("auto") takes the global one
    "separable": ({"position_score": "quadratic", "separable": True}, "separable", "position"),
    "content": (
        {
            "position_score": "learned",
            "use_content_content": True,
            "use_content_position": True,
            "use_key_bias": True,
            "key_dim": 4,
        },
        "content",
        "content",
    ),
    "windowed_position": (
        {"position_score": "gaussian", "window": 3, "windowed": True},
        "windowed_position",
        "position",
    ),
    "windowed_content": (
        {
            "position_score": None,
            "use_content_content": True,
            "use_position_bias": False,
            "window": (3, 5),
            "windowed": True,
        },
        "windowed_content",
        "content",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_subclass_overriding_the_hook_changes_the_attention_of_every_path_it_takes(case):
    """The subclass's probabilities are softmax(log P / temperature) of the layer's own P, with the same weights."""
    kwargs, base_mode, subclass_mode = CASES[case]
    base = RelativeMultiHeadAttention(HEADS, **kwargs)
    subclass = TemperatureAttention(HEADS, **{**kwargs, "separable": "auto", "windowed": "auto"})
    for layer in (base, subclass):
        layer.build(SHAPE)
    randomize_weights(base, scale=0.6)
    subclass.set_weights(base.get_weights())
    assert (base.attention_mode, subclass.attention_mode) == (base_mode, subclass_mode)
    x = np.random.default_rng(1).normal(size=SHAPE).astype("float32")
    tokens = SHAPE[1] * SHAPE[2]
    _, base_scores = base(x, return_attention_scores=True)
    outputs, scores = subclass(x, return_attention_scores=True)
    with np.errstate(divide="ignore"):  # keys outside a window: log 0 = -inf, probability 0 again
        expected_probabilities = np_softmax(np.log(full_probabilities(base_scores, tokens)) / TEMPERATURE)
    np.testing.assert_allclose(full_probabilities(scores, tokens), expected_probabilities, atol=1e-5)
    weights = {v.name: ops.convert_to_numpy(v).astype("float64") for v in base.weights}
    expected = (
        np.einsum(
            "bhqk,bkc,hco->bqo", expected_probabilities, x.reshape(SHAPE[0], tokens, -1), weights["output_kernel"]
        )
        + weights["output_bias"]
    )
    np.testing.assert_allclose(ops.convert_to_numpy(outputs).reshape(expected.shape), expected, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs", [{"separable": True}, {"window": 3, "windowed": True}], ids=["separable", "windowed"]
)
def test_a_subclass_overriding_the_hook_refuses_to_force_a_path_that_does_not_call_it(kwargs):
    with pytest.raises(ValueError, match=r"TemperatureAttention overrides `_compute_attention`.*Received: separable="):
        TemperatureAttention(HEADS, **kwargs)
    RelativeMultiHeadAttention(HEADS, **kwargs)  # the layer itself takes them
