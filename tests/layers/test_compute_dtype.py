"""Under mixed precision the per-example tensors stay in the compute dtype (issue: no float32 round trips).

Scores and softmax are float32 by design; what must not happen is a float32
copy of a (batch, tokens, heads, channels) tensor, or a contraction over keys
carried out in float32. Both are read off the traced graph of the layer.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attnconv.layers import RelativeMultiHeadAttention

BATCH, HEIGHT, WIDTH, CHANNELS, HEADS = 3, 4, 5, 8, 2


def traced_operations(layer, x):
    """(operation, input shapes, input dtypes, output shapes, output dtype) of every op of the traced call."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax
        import jax.extend.core

        # jax.core's copy was removed in JAX 0.11; older JAX has only that one.
        jaxprs_in_params = getattr(jax.extend.core, "jaxprs_in_params", None) or jax.core.jaxprs_in_params
        found = []

        def visit(jaxpr):
            for eqn in jaxpr.eqns:
                found.append(
                    (
                        eqn.primitive.name,
                        [tuple(v.aval.shape) for v in eqn.invars],
                        [str(v.aval.dtype) for v in eqn.invars],
                        [tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape")],
                        str(eqn.outvars[0].aval.dtype) if eqn.outvars else None,
                    )
                )
                for sub in jaxprs_in_params(eqn.params):
                    visit(sub)

        visit(jax.make_jaxpr(lambda inputs: layer(inputs))(x).jaxpr)
        return found
    if backend == "tensorflow":
        import tensorflow as tf

        graph = tf.function(lambda inputs: layer(inputs)).get_concrete_function(tf.TensorSpec(x.shape)).graph
        return [
            (
                op.type,
                [tuple(t.shape) for t in op.inputs],
                [t.dtype.name for t in op.inputs],
                [tuple(t.shape) for t in op.outputs if t.shape.rank is not None],
                op.outputs[0].dtype.name if op.outputs else None,
            )
            for op in graph.get_operations()
        ]
    pytest.skip(f"graph inspection is written for JAX and TensorFlow, not {backend}")


_KINDS = {
    "convert_element_type": "cast",
    "dot_general": "product",  # JAX
    "Cast": "cast",
    "Einsum": "product",
    "BatchMatMulV2": "product",
    "MatMul": "product",
}  # TensorFlow


def traced_ops(layer, x):
    """(kind, input shapes, input dtypes, output dtype) of every cast and product in the traced call."""
    return [
        (_KINDS[name], shapes, dtypes, dtype)
        for name, shapes, dtypes, _, dtype in traced_operations(layer, x)
        if name in _KINDS
    ]


def is_per_token_per_head(shape):
    return len(shape) == 4 and shape[:3] == (BATCH, HEIGHT * WIDTH, HEADS)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("score", ["quadratic", "learned", "gaussian", "siren"])
def test_no_float32_copy_of_per_token_head_tensors_and_products_in_the_compute_dtype(score, policy):
    layer = RelativeMultiHeadAttention(
        HEADS,
        position_score=score,
        use_content_content=True,
        use_content_position=True,
        use_key_bias=True,
        key_dim=6,
        position_key_projection=True,
        dtype=policy,
    )
    x = np.random.default_rng(0).normal(size=(BATCH, HEIGHT, WIDTH, CHANNELS)).astype("float32")
    layer(x)  # build outside the trace
    traced = traced_ops(layer, x)
    upcasts = [
        shapes[0]
        for kind, shapes, _, out in traced
        if kind == "cast" and out == "float32" and is_per_token_per_head(shapes[0])
    ]
    assert upcasts == []
    per_example_products = [
        (shapes, dtypes)
        for kind, shapes, dtypes, _ in traced
        if kind == "product" and any(shape and shape[0] == BATCH for shape in shapes)
    ]
    assert per_example_products  # the trace did find the layer's contractions
    compute_dtype = keras.DTypePolicy(policy).compute_dtype
    for shapes, dtypes in per_example_products:
        assert set(dtypes) == {compute_dtype}, (shapes, dtypes)


@pytest.mark.parametrize("separable", [True, False], ids=["separable", "position"])
def test_position_only_probabilities_are_applied_in_the_compute_dtype(separable):
    layer = RelativeMultiHeadAttention(HEADS, position_score="quadratic", separable=separable, dtype="mixed_bfloat16")
    x = np.random.default_rng(0).normal(size=(BATCH, HEIGHT, WIDTH, CHANNELS)).astype("float32")
    layer(x)
    products = [dtypes for kind, _, dtypes, _ in traced_ops(layer, x) if kind == "product"]
    assert products and all(set(dtypes) == {"bfloat16"} for dtypes in products)
    assert ops.convert_to_numpy(ops.isfinite(layer(x))).all()


def traced_shapes(layer, x):
    """Shapes of every intermediate tensor of the traced call."""
    return [shape for _, _, _, shapes, _ in traced_operations(layer, x) for shape in shapes]


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("key_dim", [12, 24], ids=["key_region", "input_region"])
def test_windowed_path_keeps_per_head_tensors_in_the_compute_dtype_and_forms_no_token_pair_table(key_dim, policy):
    """The windowed path: float32 scores only, products in the compute dtype, nothing of shape (.., T, .., T)."""
    channels, height, width = 16, 8, 9
    layer = RelativeMultiHeadAttention(
        HEADS,
        position_score="learned",
        use_content_content=True,
        use_content_position=True,
        use_key_bias=True,
        key_dim=key_dim,
        window=3,
        windowed=True,
        dtype=policy,
    )
    x = np.random.default_rng(0).normal(size=(BATCH, height, width, channels)).astype("float32")
    layer(x)
    assert layer.attention_mode == "windowed_content"
    traced = traced_ops(layer, x)
    widths = {channels, key_dim}  # per-head query/key/value widths (never a number of keys or shifts here)
    regions = layer.neighbourhood(height, width).region_index.shape[1]
    assert regions not in widths
    upcasts = [
        shapes[0]
        for kind, shapes, _, out in traced
        if kind == "cast"
        and out == "float32"
        and shapes[0]
        and shapes[0][0] == BATCH
        and HEADS in shapes[0]
        and shapes[0][-1] in widths
    ]
    assert upcasts == []
    compute_dtype = keras.DTypePolicy(policy).compute_dtype
    per_example = [
        (shapes, dtypes)
        for kind, shapes, dtypes, _ in traced
        if kind == "product" and any(shape and shape[0] == BATCH for shape in shapes)
    ]
    assert per_example
    for shapes, dtypes in per_example:
        assert set(dtypes) == {compute_dtype}, (shapes, dtypes)
    tokens = height * width
    assert [shape for shape in traced_shapes(layer, x) if list(shape).count(tokens) >= 2] == []
