"""Specifications of the model zoo: paper sizes, every model trains/saves/reloads, bad input."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attnconv
from keras_attnconv.models.summary import trainable_parameters

PAPER_SIZES = {"quadratic": 12.1, "gaussian": 12.1, "gaussian_pruned": 9.7, "learned": 12.3,
               "learned_content": 29.5, "learned_content_official": 29.5, "resnet18": 11.2, "resnet10": 4.9}


@pytest.mark.parametrize("name", sorted(PAPER_SIZES))
def test_parameter_count_within_one_percent_of_the_paper(name):
    params = trainable_parameters(keras_attnconv.build_model(name)) / 1e6
    assert params == pytest.approx(PAPER_SIZES[name], rel=0.01)
    assert keras_attnconv.get_paper_figures(name).params_millions == PAPER_SIZES[name]


# The two "learned emb. + content" models: score terms (content-content, content-position, key bias,
# position bias), the row/column table size per axis, and the trainable parameters.
LEARNED_CONTENT_MODELS = {
    # The paper's text (section 4.3): q.k + q.r on tables of 200 per axis, no position bias.
    "learned_content": ((True, True, False, False), 200, 29_484_282),
    # The official code's model (`--use_attention_data True`): q.k + the position-only score of `learned`.
    "learned_content_official": ((True, False, False, True), 400, 29_601_882),
}


@pytest.mark.parametrize("name", sorted(LEARNED_CONTENT_MODELS))
def test_both_learned_content_models_score_what_their_source_says(name):
    terms, axis_dim, params = LEARNED_CONTENT_MODELS[name]
    model = keras_attnconv.build_model(name)
    attention = [layer.attention for layer in model.layers if hasattr(layer, "attention")]
    assert len(attention) == 6
    for layer in attention:
        assert (layer.use_content_content, layer.use_content_position, layer.use_key_bias,
                layer.use_position_bias) == terms
        assert layer.position_score.axis_dim == axis_dim
    assert trainable_parameters(model) == params


def test_pruned_model_has_the_appendix_e_heads():
    model = keras_attnconv.build_model("gaussian_pruned")
    heads = [layer.attention.num_heads for layer in model.layers if hasattr(layer, "attention")]
    assert heads == [7, 5, 8, 7, 3, 9]  # [2, 4, 1, 2, 6, 0] of 9 pruned


def small_overrides(name):
    """Shrinks any registered model to a few thousand parameters on 8x8 images."""
    config = keras_attnconv.get_model_config(name)
    if isinstance(config, keras_attnconv.models.ResNetConfig):
        return {"image_size": 8, "widths": (8,) * len(config.widths)}
    overrides = {"num_layers": 2, "hidden_dim": 8, "intermediate_dim": 8, "image_size": 8}
    if isinstance(config.num_heads, tuple):
        overrides["num_heads"] = config.num_heads[:2]
    if config.position_embedding_dim:
        overrides["position_embedding_dim"] = 8
    return overrides


def distinct_small_models():
    """Registered names whose shrunk configs differ: a `_tiny` variant shrinks to its full model's config."""
    names, configs = [], []
    for name in keras_attnconv.list_models():
        config = keras_attnconv.get_model_config(name, **small_overrides(name))
        if config not in configs:
            names.append(name)
            configs.append(config)
    return names


@pytest.fixture(params=distinct_small_models())
def small_model(request):
    return request.param, keras_attnconv.build_model(request.param, seed=3, **small_overrides(request.param))


def batch(size=4, image_size=8):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (size, image_size, image_size, 3), dtype=np.uint8), rng.integers(0, 10, size)


def test_no_two_random_weights_of_a_model_start_alike(small_model):
    """Every randomly initialised weight is its own draw: none equals another or begins as another does.

    (An unseeded Keras initializer shared by several weights repeats its values: two blocks' kernels
    started equal, and a (heads, C, C) kernel began with the (C, C) kernel of another layer.)
    """
    _, model = small_model
    random = [(w.path, np.asarray(w).ravel()) for w in model.trainable_weights]
    random = [(path, values) for path, values in random if np.unique(values).size > 1]
    assert len(random) >= 3
    for index, (path, values) in enumerate(random):
        for other_path, other in random[index + 1:]:
            shared = min(values.size, other.size, 8)
            assert not np.array_equal(values[:shared], other[:shared]), (path, other_path)


def test_every_model_takes_a_jit_compiled_fit_step(small_model):
    _, model = small_model
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    before = [w.copy() for w in model.get_weights()]
    x, y = batch()
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_every_model_saves_and_reloads_as_itself(small_model, tmp_path):
    name, model = small_model
    path = tmp_path / f"{name}.keras"
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    assert type(restored) is type(model) and restored.name == name
    assert restored.get_config() == model.get_config() and restored.config == model.config
    x, _ = batch()
    np.testing.assert_array_equal(ops.convert_to_numpy(restored(x)), ops.convert_to_numpy(model(x)))


def test_every_model_is_reproducible_with_a_seed(small_model):
    name, model = small_model
    again = keras_attnconv.build_model(name, seed=3, **small_overrides(name))
    for first, second in zip(model.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(first, second)
    other = keras_attnconv.build_model(name, seed=4, **small_overrides(name))
    assert any(not np.array_equal(a, b) for a, b in zip(model.get_weights(), other.get_weights()))


@pytest.mark.parametrize("name", ["quadratic_tiny", "resnet_tiny"])
def test_cifar100_and_other_image_sizes(name):
    model = keras_attnconv.build_model(name, num_classes=100, image_size=24)
    assert tuple(model.input_shape) == (None, 24, 24, 3)
    assert tuple(model.output_shape) == (None, 100)
    assert model.output.dtype == "float32"


AMBIENT_POLICY = "float16"  # a global policy no test asks for: a build with `dtype` must neither follow nor set it


@pytest.mark.parametrize("dtype", ["float32", "mixed_float16", "mixed_bfloat16", "bfloat16",
                                   keras.DTypePolicy("mixed_bfloat16")], ids=str)
@pytest.mark.parametrize("name", ["learned_tiny", "absolute_learned_tiny", "resnet_tiny"])
def test_dtype_is_every_layers_policy_with_float32_logits(name, dtype):
    keras.config.set_dtype_policy(AMBIENT_POLICY)
    model = keras_attnconv.build_model(name, dtype=dtype, **small_overrides(name))
    assert keras.config.dtype_policy().name == AMBIENT_POLICY
    requested = keras.dtype_policies.get(dtype).name
    created = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    if name == "learned_tiny":  # its position scores are made by the model too, one per block's attention
        created += [model.get_layer(f"encoder_{index}").attention.position_score for index in range(2)]
    policies = {layer.name: layer.dtype_policy.name for layer in created}
    # The normalisation of the uint8 pixels and the logits are float32 under any policy.
    assert policies == {**{layer.name: requested for layer in created}, "pixel_normalization": "float32",
                        "logits": "float32"}
    assert model.dtype_policy.name == requested
    logits = model(batch()[0])
    assert logits.dtype == "float32"
    assert np.isfinite(ops.convert_to_numpy(logits)).all()


def test_without_dtype_the_global_policy_applies():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = keras_attnconv.build_model("quadratic_tiny", **small_overrides("quadratic_tiny"))
    assert model.get_layer("encoder_0").dtype_policy.name == "mixed_bfloat16"
    assert model.get_layer("logits").dtype_policy.name == "float32"


@pytest.mark.parametrize("dtype, loss_scaled", [("mixed_float16", True), ("mixed_bfloat16", False)])
def test_mixed_float16_models_compile_with_loss_scaling(dtype, loss_scaled):
    # Keras wraps the optimizer when the model's own policy is mixed_float16; the global one stays float32.
    model = keras_attnconv.build_model("resnet_tiny", dtype=dtype, **small_overrides("resnet_tiny"))
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) == loss_scaled


@pytest.mark.parametrize("call, message", [
    (lambda: keras_attnconv.build_model("quadratc"), "Did you mean 'quadratic'.*name='quadratc'"),
    (lambda: keras_attnconv.build_model("learned_content_tiny", hidden_dim=8),
     "must not exceed `hidden_dim`.*position_embedding_dim=48, hidden_dim=8"),
    (lambda: keras_attnconv.build_model(["quadratic"]), "must be a model name.*Received: name=\\['quadratic'\\]"),
    (lambda: keras_attnconv.build_model("resnet"), "Did you mean 'resnet18' or 'resnet10'"),
    (lambda: keras_attnconv.build_model("quadratic", num_layer=3), "Did you mean 'num_layers'.*num_layer=3"),
    (lambda: keras_attnconv.build_model("quadratic", image_size=31), "multiple of.*image_size=31"),
    (lambda: keras_attnconv.build_model("quadratic", num_classes=1), "num_classes=1"),
    (lambda: keras_attnconv.build_model("resnet18", num_classes=1), "num_classes=1"),
    (lambda: keras_attnconv.build_model("quadratic", num_layers=0), "num_layers=0"),
    (lambda: keras_attnconv.build_model("quadratic", dropout=1.0), "dropout=1.0"),
    (lambda: keras_attnconv.build_model("gaussian_pruned", num_layers=2), "one per layer.*num_heads=\\(7, 5"),
    (lambda: keras_attnconv.build_model("quadratic", position_score="sinus"), "position_score='sinus'"),
    (lambda: keras_attnconv.build_model("absolute_learned", absolute_encoding="fourier"),
     "absolute_encoding='fourier'"),
    (lambda: keras_attnconv.build_model("absolute_learned", position_score="quadratic"),
     "must be None when no position term.*position_score='quadratic'"),
    (lambda: keras_attnconv.build_model("quadratic_span", attention_span={"threshold": 2}), "threshold=2"),
    (lambda: keras_attnconv.build_model("quadratic", attention_span={"sigma": 2}), "Invalid `attention_span`.*sigma"),
    (lambda: keras_attnconv.build_model("quadratic", attention_span=0.1), "attention_span=0.1"),
    (lambda: keras_attnconv.build_model("learned_content", window=4), "window=4"),
    (lambda: keras_attnconv.build_model("learned_content", window=0), "window=0"),
    (lambda: keras_attnconv.build_model("learned_content", window=7, dilation=3), "window=7, dilation=3"),
    (lambda: keras_attnconv.build_model("learned_content", dilation=2), "dilation=2, window=None"),
    (lambda: keras_attnconv.build_model("learned_content_local", rematerialize="yes"), "rematerialize='yes'"),
    (lambda: keras_attnconv.build_model("quadratic", attention_span={"max_window": 6}), "max_window=6"),
    (lambda: keras_attnconv.build_model("quadratic", dtype="mixed_float32"), "dtype='mixed_float32'"),
    (lambda: keras_attnconv.build_model("resnet18", dtype="int8_from_float32"), "dtype='int8_from_float32'"),
    (lambda: keras_attnconv.get_model_config("resnet18").build(dtype="int32"), "dtype='int32'"),
    # Values a recipe or a notebook hands over that used to build another model silently.
    (lambda: keras_attnconv.build_model("quadratic_tiny", use_content_content="false"), "use_content_content='false'"),
    (lambda: keras_attnconv.build_model("quadratic_tiny", use_position_bias="no"), "use_position_bias='no'"),
    (lambda: keras_attnconv.build_model("learned", position_embedding_dim=3), "even.*position_embedding_dim=3"),
    (lambda: keras_attnconv.build_model("quadratic", layer_norm_epsilon=0), "layer_norm_epsilon=0"),
    (lambda: keras_attnconv.build_model("quadratic", layer_norm_epsilon=float("nan")), "layer_norm_epsilon=nan"),
    (lambda: keras_attnconv.build_model("quadratic", layer_norm_epsilon=-1), "layer_norm_epsilon=-1"),
    (lambda: keras_attnconv.build_model("quadratic", layer_norm_epsilon="x"), "layer_norm_epsilon='x'"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_registry_lists_every_paper_configuration():
    names = keras_attnconv.list_models()
    for name in ("resnet18", "resnet10", "quadratic", "gaussian", "gaussian_pruned", "learned",
                 "learned_content", "learned_content_official", "quadratic_16heads", "quadratic_tiny"):
        assert name in names


@pytest.mark.parametrize("name, spec", [("learned_content_local_tiny", ((7, 7), (1, 1), False)),
                                        ("absolute_learned_local_tiny", ((7, 7), (1, 1), False)),
                                        ("quadratic_span_local_tiny", ((7, 7), (1, 1), False))])
def test_local_models_attend_in_a_7x7_window_and_keep_it_through_a_keras_file(name, spec, tmp_path):
    model = keras_attnconv.build_model(name, seed=0, num_layers=1, image_size=16)
    attention = model.get_layer("encoder_0").attention
    assert attention.window_spec == spec
    global_twin = keras_attnconv.build_model(name.replace("_local", ""), num_layers=1, image_size=16)
    assert global_twin.get_layer("encoder_0").attention.window_spec is None
    path = tmp_path / "model.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert reloaded.get_layer("encoder_0").attention.window_spec == spec
    x, _ = batch(2, 16)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded(x)), keras.ops.convert_to_numpy(model(x)),
                               atol=1e-6)


def test_rematerialize_reaches_every_block_and_attention_layer_and_survives_a_keras_file(tmp_path):
    model = keras_attnconv.build_model("learned_content_local_tiny", num_layers=2, image_size=16, rematerialize=True)
    path = tmp_path / "model.keras"
    model.save(path)
    for built in (model, keras.saving.load_model(path)):
        blocks = [built.get_layer(f"encoder_{i}") for i in range(2)]
        assert [(block.rematerialize, block.attention.rematerialize) for block in blocks] == [(True, True)] * 2
    default = keras_attnconv.build_model("learned_content_local_tiny", num_layers=1, image_size=16)
    assert (default.get_layer("encoder_0").rematerialize, default.get_layer("encoder_0").attention.rematerialize) == (
        False, False)
    # Global attention has no windowed tensors to recompute; its blocks still recompute their feed-forward layers.
    global_model = keras_attnconv.build_model("learned_content_tiny", num_layers=1, image_size=16, rematerialize=True)
    assert global_model.get_layer("encoder_0").rematerialize


def test_window_from_a_recipe_list_is_a_tuple():
    config = keras_attnconv.get_model_config("learned_content", window=[7, 5], dilation=[1, 2])
    assert (config.window, config.dilation) == ((7, 5), (1, 2))
    hash(config)  # still a frozen, hashable config
