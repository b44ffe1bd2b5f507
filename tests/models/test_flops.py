"""The analytical FLOP count agrees with TensorFlow's per-op FLOP statistics of the traced graph."""

import math
import re

import keras
import numpy as np
import pytest
from support import requires_tensorflow

from keras_attnconv.layers import RelativeMultiHeadAttention, TransformerEncoderBlock
from keras_attnconv.models import build_model
from keras_attnconv.models.flops import count_flops, layer_flops

MATMUL_OPS = {"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Einsum"}


def einsum_flops(op):
    """2 x multiply-adds of a two-operand Einsum node (TensorFlow registers no statistic for it)."""
    equation = op.get_attr("equation").decode()
    inputs, _ = equation.split("->")
    sizes = {}
    for labels, tensor in zip(inputs.split(","), op.inputs):
        for label, size in zip(re.sub(r"\.\.\.", "", labels), tensor.shape.as_list()):
            sizes[label] = size
    return 2 * math.prod(sizes.values())


def graph_matmul_flops(model, batch):
    """Sum of TensorFlow's 'flops' statistics over matrix-product ops of the traced forward pass."""
    import tensorflow as tf
    from tensorflow.python.framework import ops as tf_ops

    spec = tf.TensorSpec((batch, *model.input_shape[1:]), model.inputs[0].dtype)
    graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec).graph
    total = 0
    for op in graph.get_operations():
        if op.type == "Einsum":
            total += einsum_flops(op)
        elif op.type in MATMUL_OPS:
            total += tf_ops.get_stats_for_node_def(graph, op.node_def, "flops").value
    return total


@requires_tensorflow
@pytest.mark.parametrize(
    "name, overrides",
    [
        ("quadratic", {"num_layers": 1, "hidden_dim": 24, "intermediate_dim": 40, "image_size": 8}),  # separable
        ("learned", {"num_layers": 1, "hidden_dim": 16, "position_embedding_dim": 8, "image_size": 12}),  # separable
        ("gaussian", {"num_layers": 1, "hidden_dim": 16, "intermediate_dim": 16, "image_size": 8}),  # full P
        ("gaussian_pruned", {"num_layers": 2, "num_heads": (3, 1), "hidden_dim": 16, "image_size": 8}),
        ("learned_content", {"num_layers": 1, "hidden_dim": 16, "position_embedding_dim": 8, "image_size": 8}),
        ("resnet10", {"image_size": 16}),
        (
            "gaussian",
            {
                "num_layers": 1,
                "hidden_dim": 16,
                "intermediate_dim": 16,
                "image_size": 24,
                "window": 5,
                "attention_options": {"windowed": True},
            },
        ),  # windowed, position-only
        (
            "learned_content_local",
            {
                "num_layers": 1,
                "hidden_dim": 16,
                "position_embedding_dim": 8,
                "image_size": 24,
                "attention_options": {"windowed": True},
            },
        ),  # windowed, content
    ],
)
def test_analytical_count_matches_tensorflow_statistics(name, overrides):
    model = build_model(name, **overrides)
    # Per image = the cost of one more image: work shared by the batch cancels out.
    per_image = graph_matmul_flops(model, 2) - graph_matmul_flops(model, 1)
    assert count_flops(model, executed=True).total == per_image
    windowed = any(
        layer.attention.attention_mode.startswith("windowed")
        for layer in model.layers
        if isinstance(layer, TransformerEncoderBlock)
    )
    # The algorithm's count differs only on the windowed path, where the tiles also score masked keys.
    assert (count_flops(model).total < per_image) if windowed else (count_flops(model).total == per_image)


WINDOWED_OPTIONS = {
    "position only, narrower output": {"position_score": "gaussian", "output_dim": 4},
    "content-content, folded": {"position_score": "gaussian", "use_content_content": True},
    "content-content and the gaussian's content-position": {
        "position_score": "gaussian",
        "use_content_content": True,
        "use_content_position": True,
    },
    "learned content-position, folded": {
        "position_score": "learned",
        "use_content_position": True,
        "use_position_bias": False,
        "key_dim": 16,
    },
    "learned content-content and content-position": {
        "position_score": "learned",
        "use_content_content": True,
        "use_content_position": True,
        "use_position_bias": False,
    },
    "keys narrower than the input": {
        "position_score": "learned",
        "use_content_content": True,
        "use_content_position": True,
        "key_dim": 8,
    },
    "key bias only": {"position_score": None, "use_key_bias": True, "use_position_bias": False},
    "key bias and content-content, narrow keys": {
        "position_score": None,
        "use_key_bias": True,
        "use_content_content": True,
        "use_position_bias": False,
        "key_dim": 8,
    },
    "position key projection": {
        "position_score": "learned",
        "use_content_position": True,
        "position_key_projection": True,
        "key_dim": 8,
    },
}


@requires_tensorflow
@pytest.mark.parametrize("options", WINDOWED_OPTIONS.values(), ids=WINDOWED_OPTIONS.keys())
def test_executed_count_of_the_windowed_path_matches_tensorflow_statistics(options):
    """Every branch of the tiled path (folded or projected queries, keys from the inputs or projected)."""
    height, width, channels = 10, 11, 12  # T = 110 > C: folding is decided alike for batches of 2 and 3
    layer = RelativeMultiHeadAttention(3, window=(3, 5), windowed=True, **options)
    inputs = keras.Input((height, width, channels))
    model = keras.Model(inputs, layer(inputs))
    per_image = graph_matmul_flops(model, 3) - graph_matmul_flops(model, 2)
    assert layer_flops(layer, (None, height, width, channels), executed=True).total == per_image


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="arithmetic on layer configs, the same on every backend: checked once, on TensorFlow",
)
def test_paper_convention_reproduces_table_1():
    # Table 1 counts products with weights only (2 FLOPs per multiply-add).
    expected = {"resnet18": 1.1, "quadratic": 6.2, "learned": 6.2, "learned_content": 15.0}
    for name, billions in expected.items():
        np.testing.assert_allclose(count_flops(build_model(name)).linear / 1e9, billions, rtol=0.02)


def test_attention_exposes_the_sizes_and_path_the_count_reads():
    default = RelativeMultiHeadAttention(2, position_score="quadratic")
    assert (default.key_dim, default.output_dim, default.attention_mode) == (None, None, None)
    default.build((None, 4, 5, 6))
    assert (default.key_dim, default.output_dim, default.attention_mode) == (6, 6, "separable")
    assert default.attention_mode_for(1, 2) == "position"  # H + W > H * W: the row and column passes cost more
    assert (default.get_config()["key_dim"], default.get_config()["output_dim"]) == (None, None)
    sized = RelativeMultiHeadAttention(2, position_score="quadratic", key_dim=3, output_dim=7, use_content_content=True)
    sized.build((None, 4, 5, 6))
    assert (sized.key_dim, sized.output_dim, sized.attention_mode) == (3, 7, "content")


def test_a_windowed_layer_narrower_than_its_input_contracts_the_input_channels():
    # The windowed path sums the input channels over each window, then applies the merged value/output kernel;
    # with output_dim < C the global path would contract the narrower outputs instead.
    heads, height, width, channels, out = 3, 8, 8, 10, 4
    shape = (None, height, width, channels)
    windowed = RelativeMultiHeadAttention(heads, position_score="gaussian", output_dim=out, window=3, windowed=True)
    plain = RelativeMultiHeadAttention(heads, position_score="gaussian", output_dim=out)
    for layer in (windowed, plain):
        layer.build(shape)
    assert windowed.attention_mode == "windowed_position"
    tokens = height * width
    count, plain_count = layer_flops(windowed, shape), layer_flops(plain, shape)
    assert count.linear == plain_count.linear == 2 * tokens * heads * channels * out
    assert count.attention == 2 * heads * tokens * 9 * channels
    assert plain_count.attention == 2 * heads * tokens * tokens * out


def test_windowed_attention_counts_the_window_keys_of_each_query():
    """Windowed attention: K = Kh * Kw keys per query instead of T; the projections are unchanged."""
    heads, height, width, channels, key_dim = 3, 12, 10, 8, 6
    options = {
        "position_score": "learned",
        "use_content_content": True,
        "use_content_position": True,
        "use_key_bias": True,
        "key_dim": key_dim,
    }
    shape = (None, height, width, channels)
    windowed = RelativeMultiHeadAttention(heads, window=(3, 5), **options)
    plain = RelativeMultiHeadAttention(heads, **options)
    for layer in (windowed, plain):
        layer.build(shape)
    assert windowed.attention_mode == "windowed_content"
    tokens, keys, axis_dim = height * width, 15, key_dim // 2
    count, plain_count = layer_flops(windowed, shape), layer_flops(plain, shape)
    assert count.linear == plain_count.linear
    assert count.attention == 2 * heads * tokens * (keys * (channels + key_dim) + key_dim + axis_dim * (3 + 5))
    # In an encoder block, and on the global path with the window as a mask, the count is what runs.
    block_options = {key: value for key, value in options.items() if key != "position_score"}
    block = TransformerEncoderBlock(
        heads, 16, position_score="learned", attention_options={**block_options, "window": (3, 5)}
    )
    block.build(shape)
    assert layer_flops(block, shape).attention == count.attention
    masked = RelativeMultiHeadAttention(heads, window=(3, 5), windowed=False, **options)
    masked.build(shape)
    assert layer_flops(masked, shape) == plain_count
