"""Specifications of TransformerEncoderBlock: the post-LN BERT layout, dropout, attention probabilities.

Config and `.keras` round trips, XLA and dtype policies: test_keras_conformance.py.
"""

import math

import keras
import numpy as np
import pytest
from keras import ops
from support import assert_same_values_and_gradients, eq8_reference, largest_backward_residual, randomize_weights

from keras_attnconv.layers import LearnedRelativeScore, TransformerEncoderBlock


def layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(-1, keepdims=True)
    variance = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


exact_gelu = np.vectorize(lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))


def weights_of(layer):
    return [ops.convert_to_numpy(w).astype("float64") for w in layer.weights]


def test_block_is_post_layer_norm_bert_layout():
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 6)).astype("float32")
    block = TransformerEncoderBlock(num_heads=2, intermediate_dim=8, layer_norm_epsilon=1e-12)
    block.build(x.shape)
    randomize_weights(block)

    attended = ops.convert_to_numpy(block.attention(x)).astype("float64")
    k1, b1 = weights_of(block.attention_dense)
    g1, be1 = weights_of(block.attention_norm)
    h = layer_norm(x + attended @ k1 + b1, g1, be1, 1e-12)
    k2, b2 = weights_of(block.intermediate_dense)
    k3, b3 = weights_of(block.output_dense)
    g2, be2 = weights_of(block.output_norm)
    expected = layer_norm(h + exact_gelu(h @ k2 + b2) @ k3 + b3, g2, be2, 1e-12)
    np.testing.assert_allclose(ops.convert_to_numpy(block(x)), expected, atol=1e-4)


def test_dropout_acts_only_in_training():
    x = np.random.default_rng(1).normal(size=(2, 4, 4, 6)).astype("float32")
    block = TransformerEncoderBlock(num_heads=2, intermediate_dim=8, dropout=0.3)
    inference = ops.convert_to_numpy(block(x))
    np.testing.assert_array_equal(ops.convert_to_numpy(block(x, training=False)), inference)
    assert not np.allclose(ops.convert_to_numpy(block(x, training=True)), inference)


def test_returned_probabilities_are_eq8_of_the_block_input():
    # Content terms make the probabilities depend on the input, so that it matters which input they see.
    x = np.random.default_rng(3).normal(size=(2, 3, 4, 6)).astype("float32")
    block = TransformerEncoderBlock(
        num_heads=3,
        intermediate_dim=8,
        position_score=LearnedRelativeScore(3, embedding_dim=4),
        attention_options={
            "use_content_content": True,
            "use_content_position": True,
            "use_key_bias": True,
            "key_dim": 4,
        },
    )
    block.build(x.shape)
    randomize_weights(block, scale=0.5)
    outputs, probs = block(x, return_attention_scores=True)
    _, expected = eq8_reference(block.attention, x)
    np.testing.assert_allclose(ops.convert_to_numpy(probs), expected, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(outputs), ops.convert_to_numpy(block(x)), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"intermediate_dim": 0}, "intermediate_dim=0"),
        ({"layer_norm_epsilon": 0.0}, "layer_norm_epsilon=0.0"),
        ({"num_heads": 0}, "num_heads=0"),
        ({"attention_dropout": 1.5}, "attention_dropout=1.5"),
        ({"dropout": "x"}, "dropout='x'"),
        ({"dropout": -0.1}, "dropout=-0.1"),
        ({"rematerialize": "yes"}, "rematerialize='yes'"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    options = {"num_heads": 2, "intermediate_dim": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        TransformerEncoderBlock(**options)


def test_input_with_other_channels_than_built_is_named():
    block = TransformerEncoderBlock(num_heads=2, intermediate_dim=8)
    block(np.ones((1, 4, 4, 8), "float32"))
    with pytest.raises(ValueError, match=r"expected axis -1 of input shape to have value 8.*\(1, 4, 4, 4\)"):
        block(np.ones((1, 4, 4, 4), "float32"))


@pytest.mark.parametrize("dtype", ["uint8", "int32"])
def test_integer_inputs_give_the_float_output(dtype):
    x = np.random.default_rng(5).integers(0, 8, size=(2, 3, 3, 4))
    block = TransformerEncoderBlock(
        num_heads=2,
        intermediate_dim=8,
        dropout=0.0,
        attention_dropout=0.0,
        attention_options={"use_content_content": True},
    )
    expected = ops.convert_to_numpy(block(x.astype("float32")))
    np.testing.assert_allclose(ops.convert_to_numpy(block(x.astype(dtype))), expected, atol=1e-5)


def test_rematerialized_block_has_the_same_values_and_gradients():
    """`rematerialize` recomputes the feed-forward (and windowed attention) layers; dropout masks are not redrawn."""
    shape = (2, 5, 6, 6)
    blocks = []
    for rematerialize in (False, True):
        keras.utils.set_random_seed(7)  # the same dropout seeds for both blocks
        blocks.append(
            TransformerEncoderBlock(
                num_heads=2,
                intermediate_dim=12,
                dropout=0.3,
                attention_dropout=0.3,
                position_score=None,
                attention_options={
                    "use_content_content": True,
                    "use_position_bias": False,
                    "window": 3,
                    "windowed": True,
                },
                rematerialize=rematerialize,
            )
        )
        blocks[-1].build(shape)
    assert blocks[1].attention.rematerialize and not blocks[0].attention.rematerialize
    randomize_weights(blocks[0])
    blocks[1].set_weights(blocks[0].get_weights())
    x = np.random.default_rng(8).normal(size=shape).astype("float32")
    assert_same_values_and_gradients(blocks[1], blocks[0], x, atol=1e-6, training=True)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="residuals are read from a jax.vjp function")
def test_rematerialized_block_keeps_no_feed_forward_activation_for_the_backward_pass():
    """With `rematerialize`, no (batch, H, W, intermediate_dim) tensor is kept; without it, some are."""
    shape, intermediate = (2, 4, 4, 8), 64
    biggest = {}
    for rematerialize in (False, True):
        block = TransformerEncoderBlock(
            num_heads=2, intermediate_dim=intermediate, dropout=0.0, attention_dropout=0.0, rematerialize=rematerialize
        )
        block.build(shape)
        biggest[rematerialize] = largest_backward_residual(block, shape)
    activations = int(np.prod(shape[:3])) * intermediate
    assert biggest[True] < activations <= biggest[False]
