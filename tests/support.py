"""Helpers shared by the tests, imported as ``from support import ...`` (pytest's ``pythonpath = tests``).

Fixtures live in conftest.py; plain functions live here, so that no test imports conftest.

- `LayerCase` and the ``check_*`` functions: the contract every public layer meets (a config round
  trip, a ``.keras`` round trip in safe mode, XLA equal to eager, each dtype policy, a training step).
- `eq8_reference`: eq. (8) of the paper in NumPy (float64), from a layer's weights.
- `snapshot`, `run_until_killed`: what a directory holds, byte for byte, and a script SIGKILLed where it says.
- `small_quadratic_run`: a real, finished run of a shrunk `quadratic` (results files read runs).
"""

import dataclasses
import functools
import hashlib
import inspect
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import pytest
from keras import ops

from keras_attnconv.layers import AttentionSpan, PositionScore

requires_tensorflow = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="compares against TensorFlow ops; backend is not tensorflow"
)

#: `jit_compile` for the tests' tiny training runs: each backend's fastest step for a model that small. TensorFlow's
#: graph (XLA's compilation would take most of a run); JAX's compiled step (without jit, JAX dispatches each op from
#: Python, and a killed-and-resumed run took 48 s against 16 s on TensorFlow); PyTorch's eager step.
TINY_RUN_JIT = keras.backend.backend() == "jax"
#: The same as `attnconv train --jit-compile` takes it.
TINY_RUN_JIT_FLAG = str(TINY_RUN_JIT).lower()

#: The dtype policies every layer is run under.
DTYPE_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "bfloat16")

#: Layers whose weights and outputs are float32 under any policy, by design (scores stay exact).
FLOAT32_LAYERS = (PositionScore, AttentionSpan)


def tensorflow_backend_only(why):
    """Skips a test on another backend, saying `why` it needs TensorFlow's: an export, tf.distribute, a seed's
    outcome measured there (Keras' random numbers differ between backends)."""
    return pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason=f"TensorFlow backend only: {why}")


def skip_xla_on_torch():
    """Skips an XLA check on PyTorch, where Keras' `jit_compile=True` means torch.compile, which is not checked."""
    if keras.backend.backend() == "torch":
        pytest.skip("XLA is TensorFlow's and JAX's compiler; on PyTorch, jit_compile=True is torch.compile")


def randomize_weights(layer, seed=0, scale=0.3):
    """Gives every weight of `layer` a random value, so that no term hides behind a zero init."""
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(0.0, scale, w.shape).astype("float32") for w in layer.get_weights()])


def dtype_of(tensor):
    """A tensor's dtype as Keras names it (``"float32"``): PyTorch's are ``torch.float32``, unequal to the name."""
    return keras.backend.standardize_dtype(tensor.dtype)


def numpy_outputs(outputs):
    """A layer's outputs as a list of float32 NumPy arrays (one per output)."""
    return [ops.convert_to_numpy(ops.cast(y, "float32")) for y in keras.tree.flatten(outputs)]


def value_and_gradients(layer, x, **call_kwargs):
    """Outputs, and gradients of sum(output * fixed random probe) w.r.t. the input and every trainable weight.

    Returns:
        ``(outputs, [d/dx, *d/d(layer.trainable_variables)])``.
    """

    def loss_of(outputs):
        rng = np.random.default_rng(9)
        return sum(
            ops.sum(ops.multiply(ops.cast(y, "float32"), rng.normal(size=tuple(y.shape)).astype("float32")))
            for y in keras.tree.flatten(outputs)
        )

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            outputs = layer(x, **call_kwargs)
            loss = loss_of(outputs)
        return outputs, tape.gradient(loss, [x, *layer.trainable_variables])
    if backend == "jax":
        import jax

        if not layer.built:
            layer(x, **call_kwargs)
        non_trainable = [v.value for v in layer.non_trainable_variables]

        @jax.jit  # one compilation instead of one per operation
        @functools.partial(jax.value_and_grad, argnums=(0, 1), has_aux=True)
        def loss(inputs, values):
            outputs, _ = layer.stateless_call(values, non_trainable, inputs, **call_kwargs)
            return loss_of(outputs), outputs

        (_, outputs), grads = loss(x, [v.value for v in layer.trainable_variables])
        return outputs, [grads[0], *grads[1]]
    if backend == "torch":
        import torch

        x = torch.tensor(x, requires_grad=True)
        # Keras on PyTorch draws unseeded dropout from torch's global generator, not the layer's seed: seeded here
        # so that two layers built from one seed (a path and its reference) drop the same links, as elsewhere.
        torch.manual_seed(0)
        outputs = layer(x, **call_kwargs)
        weights = [v.value for v in layer.trainable_variables]  # the torch.nn.Parameter behind each variable
        loss = loss_of(outputs)
        if not loss.requires_grad:  # outputs that depend on no input or weight (a fixed encoding)
            return outputs, [None] * (1 + len(weights))
        # None for a weight the loss does not reach, as TensorFlow's tape gives it.
        return outputs, list(torch.autograd.grad(loss, [x, *weights], allow_unused=True))
    pytest.skip(f"no gradient helper for backend {backend}")


def assert_same_values_and_gradients(layer, reference, x, atol=1e-5, **call_kwargs):
    """`layer` gives `reference`'s outputs and gradients (input and every trainable weight, named) on `x`.

    Both layers hold the same weights; the gradients also get a relative tolerance of 1e-5.
    """
    results = [value_and_gradients(each, x, **call_kwargs) for each in (layer, reference)]
    assert_same_value_and_gradients(*results, reference, atol=atol)


def assert_same_value_and_gradients(result, expected, reference, atol=1e-5):
    """Two `value_and_gradients` results agree: outputs within `atol`, gradients (input, then each of
    `reference`'s trainable weights, named) within 1e-5 absolute and relative."""
    (y, gradients), (expected_y, expected_gradients) = result, expected
    np.testing.assert_allclose(ops.convert_to_numpy(y), ops.convert_to_numpy(expected_y), atol=atol)
    names = ["inputs", *(v.name for v in reference.trainable_variables)]
    for name, a, b in zip(names, gradients, expected_gradients):
        np.testing.assert_allclose(ops.convert_to_numpy(a), ops.convert_to_numpy(b), atol=1e-5, rtol=1e-5, err_msg=name)


def assert_path_keeps_values_and_gradients(make_layer, take_path, x, seed):
    """A layer that takes a path has the values and gradients of the same layer, same weights, that does not.

    Args:
        make_layer: callable returning a new, unbuilt layer.
        take_path: callable of a bool that makes the layers called after it take the path or not
            (e.g. a monkeypatched path rule).
        x: the input.
        seed: the seed of both layers' random weights (`randomize_weights`).

    Returns:
        The layer that takes the path (built; its path rule left on).
    """

    def built(on):
        take_path(on)
        layer = make_layer()
        layer.build(x.shape)
        randomize_weights(layer, seed=seed)
        return layer

    taking, not_taking = built(True), built(False)  # the same weights: drawn from the same seed in the same order
    take_path(False)
    expected = value_and_gradients(not_taking, x)
    take_path(True)
    assert_same_value_and_gradients(value_and_gradients(taking, x), expected, not_taking)
    return taking


def largest_backward_residual(layer, shape):
    """Entries of the largest tensor a built `layer` keeps for its backward pass on inputs of `shape` (JAX only).

    The leaves of a `jax.vjp` function are the residuals it keeps for the backward pass.
    """
    import jax

    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]

    def loss(values, inputs):
        return jax.numpy.sum(layer.stateless_call(values, non_trainable, inputs)[0] ** 2)

    _, backward = jax.vjp(loss, trainable, np.ones(shape, "float32"))
    return max(int(np.prod(np.shape(leaf))) for leaf in jax.tree_util.tree_leaves(backward))


def training_calls(layer, x, count):
    """Outputs of `count` calls ``layer(x, training=True)`` (new dropout masks each), stacked, as NumPy.

    Compiled once (tf.function, or jax.jit threading the seed state), since eager calls of the
    attention cost tens of milliseconds each.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        call = tf.function(lambda: layer(x, training=True))
        return np.stack([ops.convert_to_numpy(call()) for _ in range(count)])
    if backend == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        call = jax.jit(lambda state: layer.stateless_call(trainable, state, x, training=True))
        state, outputs = [v.value for v in layer.non_trainable_variables], []
        for _ in range(count):
            y, state = call(state)
            outputs.append(np.asarray(y))
        return np.stack(outputs)
    return np.stack([ops.convert_to_numpy(layer(x, training=True)) for _ in range(count)])


@dataclasses.dataclass(frozen=True)
class LayerCase:
    """One public layer, as its constructor and the input it is checked on.

    Attributes:
        make: the layer class, or any callable returning a new layer from keyword arguments.
        init_kwargs: constructor arguments.
        input_shape: shape of the (float32, standard normal) input.
        expected_shape: output shape(s), for `run_layer_test`.
        call_kwargs: extra call arguments.
        float32_outputs: indices (in `keras.tree.flatten` order) of the outputs that are float32
            under any policy by design (scores, attention probabilities).
        untrained: names of trainable weights that a training step leaves unchanged by design
            (their gradient is zero, e.g. a key bias that adds a constant to every key's score).
        float32_layers: sublayer classes whose weights are float32 under any policy.
    """

    make: Callable
    init_kwargs: dict
    input_shape: tuple
    expected_shape: tuple
    call_kwargs: dict = dataclasses.field(default_factory=dict)
    float32_outputs: tuple = ()
    untrained: tuple = ()
    float32_layers: tuple = FLOAT32_LAYERS

    def layer(self, **kwargs):
        return self.make(**self.init_kwargs, **kwargs)

    def input(self, seed=0):
        return np.random.default_rng(seed).normal(size=self.input_shape).astype("float32")

    def randomized_layer(self, **kwargs):
        """A built layer whose every weight is random, so that a weight lost in a round trip shows."""
        layer = self.layer(**kwargs)
        layer(self.input(), **self.call_kwargs)
        randomize_weights(layer, scale=0.2)
        return layer

    def model(self, layer):
        """A functional model of the layer alone, with every output of the layer."""
        inputs = keras.Input(self.input_shape[1:], batch_size=self.input_shape[0])
        outputs = layer(inputs, **self.call_kwargs)
        assert len(keras.tree.flatten(outputs)) == len(keras.tree.flatten(layer(self.input(), **self.call_kwargs)))
        return keras.Model(inputs, outputs)


def assert_same_outputs(actual, expected, atol=0.0, rtol=0.0):
    actual, expected = numpy_outputs(actual), numpy_outputs(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert not np.isnan(e).any()  # (a span's masked keys are -inf)
        np.testing.assert_allclose(a, e, atol=atol, rtol=rtol)


def assert_same_weights_but_the_head(tuned, model, atol=0.0):
    """Every weight of `tuned` but its ``logits`` layer's is `model`'s, layer by layer (`with_config`'s new head):
    exactly, or within `atol` (weights a run has trained at a vanishing rate)."""
    for layer in tuned.layers:
        if layer.name != "logits":
            for kept, original in zip(layer.get_weights(), model.get_layer(layer.name).get_weights(), strict=True):
                np.testing.assert_allclose(kept, original, rtol=0.0, atol=atol)


def check_config_round_trip(case):
    """`from_config(get_config())` gives the same config and, with the same weights, the same outputs."""
    layer = case.randomized_layer()
    config = layer.get_config()
    clone = type(layer).from_config(config)
    x = case.input(seed=1)
    clone(x, **case.call_kwargs)
    clone.set_weights(layer.get_weights())
    assert clone.get_config() == config
    assert_same_outputs(clone(x, **case.call_kwargs), layer(x, **case.call_kwargs))


def check_keras_file_round_trip(case):
    """A model holding the layer saved as `.keras` loads in safe mode and gives the same outputs."""
    model = case.model(case.randomized_layer())
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.keras")
        model.save(path)
        restored = keras.saving.load_model(path, safe_mode=True)
    x = case.input(seed=2)
    assert_same_outputs(restored(x), model(x))


def check_xla_equals_eager(case):
    """The layer compiled with XLA (a `jit_compile=True` model) computes what it computes eagerly."""
    skip_xla_on_torch()
    model = case.model(case.randomized_layer())
    model.compile(jit_compile=True)
    assert model.jit_compile is True
    x = case.input(seed=3)
    assert_same_outputs(model.predict_on_batch(x), model(x), atol=1e-5, rtol=1e-5)


def check_dtype_policy(case, policy):
    """Under `dtype=policy`: outputs in the compute dtype, weights in the variable dtype, finite values.

    Scores and attention probabilities (`float32_outputs`) and the weights of the score and span
    layers stay float32 under any policy.
    """
    policy = keras.dtype_policies.get(policy)
    layer = case.layer(dtype=policy)
    outputs = keras.tree.flatten(layer(case.input(seed=4), **case.call_kwargs))
    expected = [("float32" if i in case.float32_outputs else policy.compute_dtype) for i in range(len(outputs))]
    assert [dtype_of(y) for y in outputs] == expected
    assert all(np.isfinite(y).all() for y in numpy_outputs(outputs))
    float32_weights = {
        id(w)
        for sublayer in layer._flatten_layers()
        if isinstance(sublayer, case.float32_layers)
        for w in sublayer.weights
    }
    dtypes = {w.path: ("float32" if id(w) in float32_weights else policy.variable_dtype) for w in layer.weights}
    assert {w.path: keras.backend.standardize_dtype(w.dtype) for w in layer.weights} == dtypes


def check_training_step(case):
    """One SGD step (with dropout active) changes every trainable weight, to finite values."""
    layer = case.layer()
    x = case.input(seed=5)
    layer(x, **case.call_kwargs)
    weights = layer.trainable_variables
    before = [ops.convert_to_numpy(w) for w in weights]
    training = {"training": True} if "training" in inspect.signature(layer.call).parameters else {}
    _, gradients = value_and_gradients(layer, x, **training, **case.call_kwargs)
    keras.optimizers.SGD(0.1).apply(gradients[1:], weights)
    after = [ops.convert_to_numpy(w) for w in weights]
    assert all(np.isfinite(w).all() for w in after)
    changed = {w.path for w, old, new in zip(weights, before, after) if np.abs(new - old).max() > 1e-6}
    assert changed == {w.path for w in weights if w.path.split("/")[-1] not in case.untrained}


#: Every check of the layer contract by name, each a function of a `LayerCase`.
LAYER_CHECKS = {
    "config_round_trip": check_config_round_trip,
    "keras_file_round_trip": check_keras_file_round_trip,
    "xla_equals_eager": check_xla_equals_eager,
    **{f"dtype_{policy}": functools.partial(check_dtype_policy, policy=policy) for policy in DTYPE_POLICIES},
    "training_step": check_training_step,
}


@dataclasses.dataclass(frozen=True)
class ModelCase:
    """One registered configuration, shrunk to a few thousand parameters, as the model contract checks it.

    Attributes:
        name: the registered name.
        overrides: config fields that shrink it (`build_model`'s overrides), ``image_size`` among them.
    """

    name: str
    overrides: dict

    def model(self, seed=3, **kwargs):
        import keras_attnconv

        return keras_attnconv.build_model(self.name, seed=seed, **{**self.overrides, **kwargs})

    def first_block_overrides(self):
        """Overrides that keep only the first of the shrunk model's blocks (attention classifiers; none for the
        others): what makes a compiled step costly to trace is one graph per block, and every block is a copy
        of the first but for its own head count, which the other checks see through the whole model."""
        if self.overrides.get("num_layers", 1) == 1:
            return {}
        heads = self.overrides.get("num_heads")
        return {"num_layers": 1, **({"num_heads": heads[:1]} if isinstance(heads, tuple) else {})}

    def batch(self, size=4):
        rng = np.random.default_rng(0)
        side = self.overrides["image_size"]
        return rng.integers(0, 256, (size, side, side, 3), dtype=np.uint8), rng.integers(0, 10, size)


def check_distinct_initial_weights(case):
    """Every randomly initialised weight is its own draw: none equals another or begins as another does.

    (An unseeded Keras initializer shared by several weights repeats its values: two blocks' kernels
    started equal, and a (heads, C, C) kernel began with the (C, C) kernel of another layer.)
    """
    model = case.model()
    random = [(w.path, np.asarray(w).ravel()) for w in model.trainable_weights]
    random = [(path, values) for path, values in random if np.unique(values).size > 1]
    assert len(random) >= 3
    for index, (path, values) in enumerate(random):
        for other_path, other in random[index + 1 :]:
            shared = min(values.size, other.size, 8)
            assert not np.array_equal(values[:shared], other[:shared]), (path, other_path)


def check_jit_compiled_fit_step(case):
    """One `fit` step compiled with XLA gives a finite loss and changes the weights (the model's first block)."""
    skip_xla_on_torch()
    model = case.model(**case.first_block_overrides())
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    before = [w.copy() for w in model.get_weights()]
    x, y = case.batch()
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def check_keras_file_reloads_as_itself(case):
    """A `.keras` file reloads in safe mode as the same class, name, config and outputs."""
    model = case.model()
    x, _ = case.batch()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, f"{case.name}.keras")
        model.save(path)
        restored = keras.saving.load_model(path, safe_mode=True)
    assert type(restored) is type(model) and restored.name == case.name
    assert restored.get_config() == model.get_config() and restored.config == model.config
    np.testing.assert_array_equal(ops.convert_to_numpy(restored(x)), ops.convert_to_numpy(model(x)))


def check_preset_reloads_as_itself(case):
    """A preset (`save_to_preset`) loads through `build_model` and `from_preset` as the same model."""
    import keras_attnconv

    model = case.model()
    x, _ = case.batch()
    with tempfile.TemporaryDirectory() as directory:
        preset = os.path.join(directory, case.name)
        keras_attnconv.save_to_preset(model, preset)
        for load in (keras_attnconv.build_model, keras_attnconv.from_preset):
            restored = load(preset)
            assert type(restored) is type(model) and restored.config == model.config
            np.testing.assert_array_equal(ops.convert_to_numpy(restored(x)), ops.convert_to_numpy(model(x)))


def check_reproducible_with_a_seed(case):
    """The same seed builds the same weights; another seed, other weights."""
    model, again, other = case.model(seed=3), case.model(seed=3), case.model(seed=4)
    for first, second in zip(model.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(first, second)
    assert any(not np.array_equal(a, b) for a, b in zip(model.get_weights(), other.get_weights()))


def check_mixed_precision_logits(case):
    """Under mixed_bfloat16 the logits are float32 and finite, the normalisation and logits layers float32."""
    model = case.model(dtype="mixed_bfloat16")
    logits = model(case.batch()[0])
    assert dtype_of(logits) == "float32"
    assert np.isfinite(ops.convert_to_numpy(logits)).all()
    assert model.get_layer("logits").dtype_policy.name == "float32"
    assert model.get_layer("pixel_normalization").dtype_policy.name == "float32"


#: Every check of the model contract by name, each a function of a `ModelCase`: what every family passes.
MODEL_CHECKS = {
    "distinct_initial_weights": check_distinct_initial_weights,
    "jit_compiled_fit_step": check_jit_compiled_fit_step,
    "keras_file_reloads_as_itself": check_keras_file_reloads_as_itself,
    "preset_reloads_as_itself": check_preset_reloads_as_itself,
    "reproducible_with_a_seed": check_reproducible_with_a_seed,
    "mixed_precision_logits": check_mixed_precision_logits,
}


def small_overrides(name):
    import keras_attnconv

    """Overrides that shrink a registered attention classifier or ResNet to a few thousand parameters on 8x8 images."""
    config = keras_attnconv.get_model_config(name)
    if isinstance(config, keras_attnconv.models.ResNetConfig):
        return {"image_size": 8, "widths": (8,) * len(config.widths)}
    overrides = {"num_layers": 2, "hidden_dim": 8, "intermediate_dim": 8, "image_size": 8}
    if isinstance(config.num_heads, tuple):
        overrides["num_heads"] = config.num_heads[:2]
    if config.position_embedding_dim:
        overrides["position_embedding_dim"] = 8
    return overrides


def family_cases(family, shrink=small_overrides):
    """A `ModelCase` per registered name of `family` (its model class's name) whose shrunk config is new.

    ``shrink(name)``: the overrides that make a registered config of the family small. A `_tiny` variant
    shrinks to its full model's config, and is checked once.
    """
    import keras_attnconv

    cases, configs = [], []
    for name in keras_attnconv.list_models():
        card = keras_attnconv.get_model_card(name)
        if card.family != family:
            continue
        config = keras_attnconv.get_model_config(name, **shrink(name))
        if config not in configs:
            cases.append(ModelCase(name, shrink(name)))
            configs.append(config)
    return cases


def walk_modules():
    """``{relative path: source}`` of docs/architecture.md's walk (adding a score and a family): its code
    blocks, each opening with a ``# path.py`` comment."""
    import re

    text = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    section = text[text.index("## Adding a position score or a model family") :]
    return dict(re.findall(r"```python\n# (\S+\.py)\n(.*?)```", section, re.S))


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def relative_encoding_reference(score, height, width):
    """r_delta straight from the definitions, for every (query, key) pixel pair: (T, T, D_p), float64."""
    rows, cols = np.divmod(np.arange(height * width), width)
    d1, d2 = rows[None, :] - rows[:, None], cols[None, :] - cols[:, None]  # delta = key - query
    name = type(score).__name__
    if name == "QuadraticScore":
        return np.stack([d1**2 + d2**2, d1, d2], axis=-1).astype("float64")
    if name == "SirenScore":
        # z_1 = sin(omega_0 (u W_1 + b_1)), z_{k+1} = sin(omega_0 (z_k W_k + b_k)) of u = delta / (size - 1).
        z = np.stack([d1 / max(height - 1, 1), d2 / max(width - 1, 1)], axis=-1).astype("float64")
        for kernel, bias in zip(score.sine_kernels, score.sine_biases):
            z = np.sin(score.omega_0 * (z @ ops.convert_to_numpy(kernel) + ops.convert_to_numpy(bias)))
        return z
    rows_table = ops.convert_to_numpy(score.row_embeddings)[d1 + score.row_size - 1]
    cols_table = ops.convert_to_numpy(score.col_embeddings)[d2 + score.col_size - 1]
    return np.concatenate([rows_table, cols_table], axis=-1).astype("float64")


def head_vectors_reference(score):
    """v_h of eq. (8) from the weights: (heads, D_p)."""
    name = type(score).__name__
    if name == "QuadraticScore":
        alpha, centers = ops.convert_to_numpy(score.alpha), ops.convert_to_numpy(score.centers)
        return -alpha[:, None] * np.concatenate([np.ones((len(alpha), 1)), -2 * centers], axis=-1)
    if name == "SirenScore":
        return ops.convert_to_numpy(score.head_kernel).astype("float64").T
    return np.concatenate(
        [ops.convert_to_numpy(score.row_head_vectors), ops.convert_to_numpy(score.col_head_vectors)], axis=-1
    )


def eq8_reference(layer, x):
    """Eq. (8) in NumPy (float64) with the weights of a `RelativeMultiHeadAttention`.

    Covers the four score terms with the quadratic, learned and SIREN encodings.

    Returns:
        (outputs (batch, H, W, output_dim), probabilities (batch, heads, T, T)).
    """
    batch, height, width, channels = x.shape
    tokens = x.reshape(batch, height * width, channels).astype("float64")
    w = {v.path.split("/")[-1]: ops.convert_to_numpy(v).astype("float64") for v in layer.weights}
    scores = np.zeros((batch, layer.num_heads, height * width, height * width))
    if "query_kernel" in w:
        q = np.einsum("btc,chd->bthd", tokens, w["query_kernel"]) + w.get("query_bias", 0)
    if "key_kernel" in w:
        k = np.einsum("btc,chd->bthd", tokens, w["key_kernel"]) + w.get("key_bias", 0)
    key_dims = [w[name].shape[-1] for name in ("query_kernel", "key_kernel") if name in w]  # none: no content term
    s = layer.content_scale if layer.content_scale is not None else (key_dims or [1])[0] ** -0.5
    if layer.use_content_content:
        scores += s * np.einsum("bqhd,bkhd->bhqk", q, k)
    if layer.use_key_bias:
        scores += s * np.einsum("hd,bkhd->bhk", w["u"], k)[:, :, None, :]
    if layer.use_content_position or layer.use_position_bias:
        r = relative_encoding_reference(layer.position_score, height, width)
    if layer.use_content_position:
        if layer.position_key_projection:
            projected = np.einsum("bqhd,hde->bqhe", q, w["position_key_kernel"])
        else:
            projected = q[..., : r.shape[-1]]  # W_hat = identity padded to key_dim
        scores += s * np.einsum("bqhe,qke->bhqk", projected, r)
    if layer.use_position_bias:
        scores += np.einsum("hd,qkd->hqk", head_vectors_reference(layer.position_score), r)[None]
    probs = np_softmax(scores)
    context = np.einsum("bhqk,bkc->bqhc", probs, tokens)
    out = np.einsum("bqhc,hco->bqo", context, w["output_kernel"]) + w.get("output_bias", 0)
    return out.reshape(batch, height, width, -1), probs


def snapshot(path):
    """Everything under `path`, byte for byte: {relative name: bytes, "<dir>" or "-> link target"} (None if absent).

    Two equal snapshots mean nothing was added, removed, replaced or changed.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_file():
        return {".": path.read_bytes()}
    found = {}
    for entry in sorted(path.rglob("*")):
        name = str(entry.relative_to(path))
        if entry.is_symlink():
            found[name] = f"-> {os.readlink(entry)}"
        elif entry.is_dir():
            found[name] = "<dir>"
        else:
            found[name] = entry.read_bytes()
    return found


#: Prepended to the scripts of `run_until_killed`: ``die()`` SIGKILLs the process, as a crash or an OOM kill would.
KILL_PRELUDE = """
import os, signal

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def die_after(owner, name):
    real = getattr(owner, name)
    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        die()
        return result
    setattr(owner, name, wrapped)

def die_before(owner, name):
    setattr(owner, name, lambda *args, **kwargs: die())
"""


def run_until_killed(script, timeout=300):
    """Runs `script` (after `KILL_PRELUDE`) in a fresh Python process and checks that it died of SIGKILL."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", KILL_PRELUDE + textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == -signal.SIGKILL, f"the script was not killed where it should be: {result.stderr}"


def traced_steps(model):
    """{"train": n, "test": n}: how many times `model`'s train and test steps are traced (called in Python).

    Either backend's step: TensorFlow's takes (data), JAX's (state, data).
    """
    traces = {"train": 0, "test": 0}
    for kind in traces:
        step = getattr(model, f"{kind}_step")

        def counted(*step_args, kind=kind, step=step):
            traces[kind] += 1
            return step(*step_args)

        setattr(model, f"{kind}_step", counted)
    return traces


def tiny_model(name="tiny", seed=0):
    """A model that exports in about a second: enough for the publication and file-system tests."""
    from keras_attnconv.models import ResNet

    keras.utils.set_random_seed(seed)
    return ResNet(image_size=8, num_classes=3, blocks_per_stage=(1,), widths=(2,), name=name)


#: A one-layer quadratic_tiny: the smallest attention model that trains on real images in seconds.
SMALL_MODEL = {"num_layers": 1, "hidden_dim": 16, "intermediate_dim": 16}


def small_config(small_npz, run_dir=None, **overrides):
    """A `TrainConfig` of two short epochs of `SMALL_MODEL` on `small_npz`, in `run_dir`, nothing exported."""
    from keras_attnconv.training.recipe import TrainConfig

    values = {
        "name": "small",
        "model": "quadratic_tiny",
        "model_overrides": SMALL_MODEL,
        "dataset": small_npz,
        "epochs": 2,
        "batch_size": 20,
        "run_dir": run_dir and str(run_dir),
        "verbose": 0,
        "jit_compile": TINY_RUN_JIT,
        "export_dir": None,
    }
    return TrainConfig(**{**values, **overrides})


def tiny_train_command(small_npz, run_dir, export_dir="none", runs_dir=None, **flags):
    """`attnconv train` of a tiny run (one epoch of 160 8x8 images), as its arguments: into `run_dir`, or a
    directory of `runs_dir` where `run_dir` is None; `flags` (``epochs=2``, ``jit_compile="auto"``) replace or add
    to its recipe fields."""
    fields = {
        "model": "quadratic_tiny",
        "model_overrides": "{num_layers = 1, hidden_dim = 8, intermediate_dim = 8}",
        "dataset": small_npz,
        "epochs": 1,
        "batch_size": 40,
        "jit_compile": TINY_RUN_JIT_FLAG,
        "export_dir": export_dir,
        **flags,
    }
    arguments = [text for field, value in fields.items() for text in (f"--{field.replace('_', '-')}", str(value))]
    return ["train", *arguments, *(["--run-dir", str(run_dir)] if run_dir else ["--runs-dir", str(runs_dir)])]


def served_config(root):
    """models.config parsed by TF Serving's own message: {name: (base_path, platform, served versions)}."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = text_format.Parse((root / "models.config").read_text(), model_server_config_pb2.ModelServerConfig())
    return {
        entry.name: (entry.base_path, entry.model_platform, list(entry.model_version_policy.specific.versions))
        for entry in config.model_config_list.config
    }


def tree_digest(path):
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + file.read_bytes())
    return digest.hexdigest()


def quick_bench_on_jax(suite, output, environment):
    """`attnconv bench --suite <suite> --quick` in a subprocess with `environment` (e.g. JAX without
    TensorFlow): asserts it succeeded and returns (its results file's JSON, the completed process)."""
    import json

    command = [
        sys.executable,
        "-m",
        "keras_attnconv.cli",
        "bench",
        "--suite",
        suite,
        "--quick",
        "--output",
        str(output),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    assert result.returncode == 0, result.stderr
    results = json.loads(Path(output).read_text())
    assert results["device"]["backend"] == "jax" and "tensorflow" not in results["device"]
    return results, result


def small_quadratic_run(run_dir, dataset, **changes):
    """A real, finished 2-epoch run of `quadratic` shrunk to one small block in `run_dir`, its config with `changes`.

    Its model is Table 1's quadratic row; `changes` make the runs whose gains `attnconv choices` records.
    """
    from keras_attnconv.training.fit import train
    from keras_attnconv.training.recipe import TrainConfig

    config = dict(
        name="quadratic_small",
        model="quadratic",
        model_overrides={"num_layers": 1, "hidden_dim": 16, "intermediate_dim": 16},
        dataset=dataset,
        epochs=2,
        batch_size=20,
        run_dir=str(run_dir),
        verbose=0,
        jit_compile=TINY_RUN_JIT,
        export_dir=None,
    )
    train(TrainConfig(**{**config, **changes}))
    return run_dir
