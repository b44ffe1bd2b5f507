"""Every public layer passes Keras' own layer contract (`keras.src.testing.TestCase.run_layer_test`).

That check builds each layer eagerly and symbolically, round-trips its config,
trains it one step in a compiled `fit` and re-creates it with the
``mixed_float16`` policy, where the symbolic output dtypes
(`compute_output_spec`) must match the real ones and all weights must stay
float32. Layers whose outputs are float32 by design (scores, spans) must say
so in their output spec.

The score layers and `AttentionSpan` take the feature map (batch, H, W, C) and
use its static shape only, so `run_layer_test` drives them directly; their
output (heads, H*W, H*W) has no batch axis, which the check does not need.
"""

import keras
import pytest
from keras.src.testing import TestCase

import keras_attnconv.layers as layers_module
from keras_attnconv.conversion import ConvolutionAsAttention
from keras_attnconv.layers import (
    AttentionSpan,
    GaussianScore,
    InvertibleDownsampling,
    LearnedPositionEmbedding,
    LearnedRelativeScore,
    QuadraticScore,
    RelativeMultiHeadAttention,
    SinusoidalPositionEmbedding,
    SirenScore,
    TransformerEncoderBlock,
)
from keras_attnconv.layers import __all__ as public_names

# Warnings of Keras' own test harness (generator input, layers without weights), not of the layers.
pytestmark = [pytest.mark.filterwarnings("ignore:`shuffle=True` was passed:UserWarning"),
              pytest.mark.filterwarnings("ignore:The model does not have any trainable weights:UserWarning")]

HEADS, CHANNELS = 2, 8
INPUT_SHAPE = (2, 4, 4, CHANNELS)
TOKENS = INPUT_SHAPE[1] * INPUT_SHAPE[2]
FEATURE_MAP = INPUT_SHAPE
SCORES = (HEADS, TOKENS, TOKENS)


def attention_case(mode, expected_shape=FEATURE_MAP, call_kwargs=None, **kwargs):
    return pytest.param(RelativeMultiHeadAttention, {"num_heads": HEADS, **kwargs}, expected_shape, call_kwargs,
                        id=f"RelativeMultiHeadAttention-{mode}")


CASES = [
    # Every score also runs inside the attention; a score instance is passed as its config, since
    # run_layer_test creates the layer several times from the same arguments.
    attention_case("separable", position_score="quadratic"),
    attention_case("general", position_score="gaussian", dropout=0.1),
    attention_case("content", position_score="learned", use_content_content=True, use_content_position=True,
                   use_key_bias=True, key_dim=4),
    attention_case("span", attention_span={"threshold": 0.1}, position_score=keras.saving.serialize_keras_object(
        GaussianScore(HEADS, diagonal=True, dtype="float32"))),
    attention_case("scores_returned", call_kwargs={"return_attention_scores": True},
                   expected_shape=((*INPUT_SHAPE[:3], 4), (INPUT_SHAPE[0], *SCORES)), position_score="siren",
                   output_dim=4),
    pytest.param(QuadraticScore, {"num_heads": HEADS}, SCORES, None, id="QuadraticScore"),
    pytest.param(GaussianScore, {"num_heads": HEADS}, SCORES, None, id="GaussianScore"),
    pytest.param(GaussianScore, {"num_heads": HEADS, "diagonal": True}, SCORES, None, id="GaussianScore-diagonal"),
    pytest.param(LearnedRelativeScore, {"num_heads": HEADS, "embedding_dim": 4}, SCORES, None,
                 id="LearnedRelativeScore"),
    pytest.param(SirenScore, {"num_heads": HEADS, "hidden_units": 8}, SCORES, None, id="SirenScore"),
    pytest.param(AttentionSpan, {"num_heads": HEADS}, SCORES, None, id="AttentionSpan"),
    pytest.param(AttentionSpan, {"num_heads": HEADS, "threshold": None, "span_dims": 1}, SCORES, None,
                 id="AttentionSpan-soft-1d"),
    pytest.param(InvertibleDownsampling, {"block_size": 2}, (2, 2, 2, 4 * CHANNELS), None,
                 id="InvertibleDownsampling"),
    pytest.param(TransformerEncoderBlock, {"num_heads": HEADS, "intermediate_dim": 16, "attention_dropout": 0.0},
                 FEATURE_MAP, None, id="TransformerEncoderBlock"),
    pytest.param(LearnedPositionEmbedding, {}, FEATURE_MAP, None, id="LearnedPositionEmbedding"),
    pytest.param(SinusoidalPositionEmbedding, {}, FEATURE_MAP, None, id="SinusoidalPositionEmbedding"),
    pytest.param(ConvolutionAsAttention, {
        "attention": keras.saving.serialize_keras_object(RelativeMultiHeadAttention(
            num_heads=4, output_dim=4, position_score=QuadraticScore(4, dtype="float32"))),
        "kernel_size": (2, 2), "strides": (2, 2), "dilation_rate": (1, 1), "padding": "same",
    }, (2, 2, 2, 4), None, id="ConvolutionAsAttention"),
]


@pytest.mark.parametrize(("layer_cls", "init_kwargs", "expected_shape", "call_kwargs"), CASES)
def test_layer_passes_keras_run_layer_test(layer_cls, init_kwargs, expected_shape, call_kwargs):
    TestCase().run_layer_test(
        layer_cls, init_kwargs, input_shape=INPUT_SHAPE, call_kwargs=call_kwargs,
        expected_output_shape=expected_shape,
        # Keras' training step calls the layer without `call_kwargs`, so it would train on the output alone
        # while `expected_output_shape` describes (outputs, probabilities): the other cases train that path.
        run_training_check=call_kwargs is None, run_mixed_precision_check=True,
    )


def test_attention_cases_take_the_path_they_are_named_after():
    modes = {}
    for param in CASES:
        if param.values[0] is RelativeMultiHeadAttention:
            layer = RelativeMultiHeadAttention(**param.values[1])
            layer.build(INPUT_SHAPE)
            modes[param.id.split("-")[1]] = layer.attention_mode
    assert modes == {"separable": "separable", "general": "position", "content": "content", "span": "position",
                     "scores_returned": "position"}


def test_every_public_layer_has_a_conformance_case():
    layers = {name for name in public_names if isinstance(getattr(layers_module, name), type)
              and issubclass(getattr(layers_module, name), keras.layers.Layer)}
    abstract = {"PositionScore"}  # the base class of the score layers, not meant to be instantiated
    assert layers - abstract == {param.values[0].__name__ for param in CASES} - {"ConvolutionAsAttention"}
