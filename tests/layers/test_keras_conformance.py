"""Every public layer and every position score meets the layer contract.

Keras' own check (`keras.src.testing.TestCase.run_layer_test`) builds each layer
eagerly and symbolically, round-trips its config and re-creates it with the
``mixed_float16`` policy, where the symbolic output dtypes (`compute_output_spec`)
must match the real ones and all weights must stay float32. Layers whose outputs
are float32 by design (scores, spans) must say so in their output spec.

The checks of `support` add what that check leaves out: equal outputs after a
config round trip and after a ``.keras`` round trip in safe mode, XLA equal to
eager, each of the float32 / mixed_float16 / mixed_bfloat16 / bfloat16 dtype
policies, and a training step (with the call arguments) that changes every weight;
it replaces Keras' training check, which only runs a step.

The score layers and `AttentionSpan` take the feature map (batch, H, W, C) and
use its static shape only, so they are driven directly; their output
(heads, H*W, H*W) has no batch axis.
"""

import functools

import keras
import pytest
from keras.src.testing import TestCase
from support import FLOAT32_LAYERS, LAYER_CHECKS, LayerCase

import keras_attnconv.layers as layers_module
from keras_attnconv.layers import (
    AttentionSpan,
    ConvolutionAsAttention,
    GaussianScore,
    InvertibleDownsampling,
    LearnedPositionEmbedding,
    LearnedRelativeScore,
    MirrorAverage,
    MirroredBatch,
    PixelNormalization,
    QuadraticScore,
    RelativeMultiHeadAttention,
    SinusoidalPositionEmbedding,
    SirenScore,
    TransformerEncoderBlock,
    get_position_score,
)
from keras_attnconv.layers import __all__ as public_names

# Warnings of Keras' own test harness (generator input, layers without weights), not of the layers.
pytestmark = [
    pytest.mark.filterwarnings("ignore:`shuffle=True` was passed:UserWarning"),
    pytest.mark.filterwarnings("ignore:The model does not have any trainable weights:UserWarning"),
]

HEADS, CHANNELS = 2, 8
INPUT_SHAPE = (2, 4, 4, CHANNELS)
TOKENS = INPUT_SHAPE[1] * INPUT_SHAPE[2]
FEATURE_MAP = INPUT_SHAPE
SCORES = (HEADS, TOKENS, TOKENS)

# The diagonal Gaussian through the factory, whichever class implements it.
diagonal_gaussian = functools.partial(get_position_score, "gaussian", diagonal=True)


def case(make, init_kwargs, expected_shape=FEATURE_MAP, case_id=None, **options):
    return pytest.param(
        LayerCase(make, init_kwargs, INPUT_SHAPE, expected_shape, **options), id=case_id or make.__name__
    )


def score_case(make, case_id=None, **init_kwargs):
    return case(make, {"num_heads": HEADS, **init_kwargs}, SCORES, case_id, float32_outputs=(0,))


def attention_case(mode, **kwargs):
    return case(
        RelativeMultiHeadAttention, {"num_heads": HEADS, **kwargs}, case_id=f"RelativeMultiHeadAttention-{mode}"
    )


CASES = [
    # Every score also runs inside the attention; a score instance is passed as its config, since
    # the checks create the layer several times from the same arguments.
    attention_case("separable", position_score="quadratic"),
    attention_case("general", position_score="gaussian", dropout=0.1),
    # The key bias adds q.b_k (and u.b_k) to every key of a query alike, which softmax ignores (`untrained`).
    case(
        RelativeMultiHeadAttention,
        {
            "num_heads": HEADS,
            "position_score": "learned",
            "use_content_content": True,
            "use_content_position": True,
            "use_key_bias": True,
            "key_dim": 4,
            "content_scale": 0.5,
            "dropout": 0.1,
        },
        case_id="RelativeMultiHeadAttention-content",
        untrained=("key_bias",),
    ),
    attention_case(
        "separable_diagonal",
        position_score=keras.saving.serialize_keras_object(diagonal_gaussian(HEADS, dtype="float32")),
        dropout=0.1,
    ),
    attention_case(
        "span",
        attention_span={"threshold": 0.1},
        position_score=keras.saving.serialize_keras_object(diagonal_gaussian(HEADS, dtype="float32")),
    ),
    case(
        RelativeMultiHeadAttention,
        {"num_heads": HEADS, "position_score": "siren", "output_dim": 4},
        ((*INPUT_SHAPE[:3], 4), (INPUT_SHAPE[0], *SCORES)),
        "RelativeMultiHeadAttention-scores_returned",
        call_kwargs={"return_attention_scores": True},
        float32_outputs=(1,),
    ),
    # Windowed (neighbourhood) attention, forced onto its tiled path on this small map.
    case(
        RelativeMultiHeadAttention,
        {
            "num_heads": HEADS,
            "position_score": "learned",
            "use_content_content": True,
            "use_content_position": True,
            "key_dim": 4,
            "window": 3,
            "windowed": True,
            "dropout": 0.1,
        },
        case_id="RelativeMultiHeadAttention-windowed_content",
        untrained=("key_bias",),
    ),
    attention_case(
        "windowed_position", position_score="gaussian", window=(3, 1), dilation=(1, 2), windowed=True, dropout=0.1
    ),
    score_case(QuadraticScore),
    score_case(GaussianScore),
    score_case(diagonal_gaussian, "GaussianScore-diagonal"),
    score_case(LearnedRelativeScore, embedding_dim=4),
    score_case(SirenScore, hidden_units=8),
    score_case(AttentionSpan),
    score_case(AttentionSpan, "AttentionSpan-soft-1d", threshold=None, span_dims=1),
    case(InvertibleDownsampling, {"block_size": 2}, (2, 2, 2, 4 * CHANNELS)),
    case(TransformerEncoderBlock, {"num_heads": HEADS, "intermediate_dim": 16, "attention_dropout": 0.1}),
    case(
        TransformerEncoderBlock,
        {
            "num_heads": HEADS,
            "intermediate_dim": 16,
            "position_score": keras.saving.serialize_keras_object(
                LearnedRelativeScore(HEADS, embedding_dim=4, head_vectors=False, dtype="float32")
            ),
            "attention_options": {
                "use_content_content": True,
                "use_content_position": True,
                "use_position_bias": False,
                "key_dim": 4,
            },
        },
        (INPUT_SHAPE, (INPUT_SHAPE[0], *SCORES)),
        "TransformerEncoderBlock-content-scores_returned",
        call_kwargs={"return_attention_scores": True},
        float32_outputs=(1,),
        untrained=("key_bias",),
    ),
    # Recomputed feed-forward and windowed attention (its dropout mask drawn outside the recomputed parts).
    case(
        TransformerEncoderBlock,
        {
            "num_heads": HEADS,
            "intermediate_dim": 16,
            "rematerialize": True,
            "position_score": None,
            "attention_options": {
                "use_content_content": True,
                "use_position_bias": False,
                "key_dim": 4,
                "window": 3,
                "windowed": True,
            },
        },
        case_id="TransformerEncoderBlock-rematerialized",
        untrained=("key_bias",),
    ),
    pytest.param(
        LayerCase(PixelNormalization, {"mean": (0.5, 0.4, 0.3), "std": (0.2, 0.25, 0.3)}, (2, 4, 4, 3), (2, 4, 4, 3)),
        id="PixelNormalization",
    ),
    # Test-time flips: called at inference (training=False, their default), the batch doubles, then halves.
    case(MirroredBatch, {}, (2 * INPUT_SHAPE[0], *INPUT_SHAPE[1:])),
    case(MirrorAverage, {}, (INPUT_SHAPE[0] // 2, *INPUT_SHAPE[1:])),
    case(LearnedPositionEmbedding, {}),
    case(SinusoidalPositionEmbedding, {"max_wavelength": 500.0}),
    # The wrapped attention keeps the policy of its own config (float32 here), as `conv_to_attention` makes it.
    case(
        ConvolutionAsAttention,
        {
            "attention": keras.saving.serialize_keras_object(
                RelativeMultiHeadAttention(
                    num_heads=4, output_dim=4, position_score=QuadraticScore(4, dtype="float32"), dtype="float32"
                )
            ),
            "kernel_size": (2, 2),
            "strides": (2, 2),
            "dilation_rate": (1, 1),
            "padding": "same",
        },
        (2, 2, 2, 4),
        float32_layers=(*FLOAT32_LAYERS, RelativeMultiHeadAttention),
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_layer_passes_keras_run_layer_test(case):
    TestCase().run_layer_test(
        case.make,
        case.init_kwargs,
        input_shape=case.input_shape,
        call_kwargs=case.call_kwargs,
        expected_output_shape=case.expected_shape,
        # The "training_step" check trains every case (with its call arguments, which Keras' `fit`
        # step leaves out) and checks more than that the step runs.
        run_training_check=False,
        run_mixed_precision_check=True,
    )


@pytest.mark.parametrize("check", LAYER_CHECKS)
@pytest.mark.parametrize("case", CASES)
def test_layer_meets_the_contract(case, check):
    LAYER_CHECKS[check](case)


def test_attention_cases_take_the_path_they_are_named_after():
    modes = {}
    for param in CASES:
        if param.id.startswith("RelativeMultiHeadAttention-"):
            layer = param.values[0].layer()
            layer.build(INPUT_SHAPE)
            modes[param.id.split("-")[1]] = layer.attention_mode
    assert modes == {
        "separable": "separable",
        "general": "position",
        "content": "content",
        "separable_diagonal": "separable",
        "span": "position",
        "scores_returned": "position",
        "windowed_content": "windowed_content",
        "windowed_position": "windowed_position",
    }


def test_every_public_layer_and_score_has_a_case():
    layers = {
        name
        for name in public_names
        if isinstance(getattr(layers_module, name), type)
        and issubclass(getattr(layers_module, name), keras.layers.Layer)
    }
    abstract = {"PositionScore"}  # the base class of the score layers, not meant to be instantiated
    covered = {type(param.values[0].layer()).__name__ for param in CASES}
    assert layers - abstract <= covered
    scores = {score.__name__ for score in layers_module.POSITION_SCORES.values()}
    assert scores | {type(diagonal_gaussian(HEADS)).__name__} <= covered
