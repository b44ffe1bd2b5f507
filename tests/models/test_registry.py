"""Specifications of the model zoo's registry: names, listing, building from a name or a preset, bad input."""

import keras
import numpy as np
import pytest
from keras import ops
from support import dtype_of, small_overrides

import keras_attnconv


def batch(size=4, image_size=8):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (size, image_size, image_size, 3), dtype=np.uint8), rng.integers(0, 10, size)


@pytest.mark.parametrize("name", ["quadratic_tiny", "resnet_tiny"])
def test_cifar100_and_other_image_sizes(name):
    model = keras_attnconv.build_model(name, num_classes=100, image_size=24)
    assert tuple(model.input_shape) == (None, 24, 24, 3)
    assert tuple(model.output_shape) == (None, 100)
    assert model.output.dtype == "float32"


AMBIENT_POLICY = "float16"  # a global policy no test asks for: a build with `dtype` must neither follow nor set it


@pytest.mark.parametrize(
    "dtype", ["float32", "mixed_float16", "mixed_bfloat16", "bfloat16", keras.DTypePolicy("mixed_bfloat16")], ids=str
)
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
    assert policies == {
        **{layer.name: requested for layer in created},
        "pixel_normalization": "float32",
        "logits": "float32",
    }
    assert model.dtype_policy.name == requested
    logits = model(batch()[0])
    assert dtype_of(logits) == "float32"
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


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: keras_attnconv.build_model("quadratc"), "Did you mean 'quadratic'.*name='quadratc'"),
        (
            lambda: keras_attnconv.build_model("learned_content_tiny", hidden_dim=8),
            "must not exceed `hidden_dim`.*position_embedding_dim=48, hidden_dim=8",
        ),
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
        (
            lambda: keras_attnconv.build_model("absolute_learned", absolute_encoding="fourier"),
            "absolute_encoding='fourier'",
        ),
        (
            lambda: keras_attnconv.build_model("absolute_learned", position_score="quadratic"),
            "must be None when no position term.*position_score='quadratic'",
        ),
        (
            lambda: keras_attnconv.build_model("quadratic", use_position_bias=False, position_score=None),
            "a term to score with. Received: use_content_content=False, use_content_position=False, "
            "use_position_bias=False$",
        ),
        (lambda: keras_attnconv.build_model("quadratic_span", attention_span={"threshold": 2}), "threshold=2"),
        (
            lambda: keras_attnconv.build_model("quadratic", attention_span={"sigma": 2}),
            "Invalid `attention_span`.*sigma",
        ),
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
        (
            lambda: keras_attnconv.build_model("quadratic_tiny", use_content_content="false"),
            "use_content_content='false'",
        ),
        (lambda: keras_attnconv.build_model("quadratic_tiny", use_position_bias="no"), "use_position_bias='no'"),
        (lambda: keras_attnconv.build_model("learned", position_embedding_dim=3), "even.*position_embedding_dim=3"),
        (lambda: keras_attnconv.build_model("quadratic", layer_norm_epsilon=0), "layer_norm_epsilon=0"),
        (lambda: keras_attnconv.build_model("quadratic", layer_norm_epsilon=float("nan")), "layer_norm_epsilon=nan"),
        (lambda: keras_attnconv.build_model("quadratic", layer_norm_epsilon=-1), "layer_norm_epsilon=-1"),
        (lambda: keras_attnconv.build_model("quadratic", layer_norm_epsilon="x"), "layer_norm_epsilon='x'"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_registry_lists_every_paper_configuration():
    names = keras_attnconv.list_models()
    for name in (
        "resnet18",
        "resnet10",
        "quadratic",
        "gaussian",
        "gaussian_pruned",
        "learned",
        "learned_content",
        "learned_content_official",
        "quadratic_16heads",
        "quadratic_tiny",
    ):
        assert name in names


def test_list_models_takes_a_glob_pattern_and_lists_small_variants_last():
    assert keras_attnconv.list_models("resnet*") == ["resnet18", "resnet10", "resnet_tiny"]
    assert keras_attnconv.list_models("*_local_tiny") == [
        "learned_content_local_tiny",
        "absolute_learned_local_tiny",
        "quadratic_span_local_tiny",
    ]
    assert keras_attnconv.list_models("nothing*") == []
    sources = [keras_attnconv.get_paper_figures(name).source == "ours" for name in keras_attnconv.list_models()]
    assert sources == sorted(sources)  # every paper or follow-up configuration before every small variant
    with pytest.raises(ValueError, match="Received: pattern=3"):
        keras_attnconv.list_models(3)


def test_every_card_names_its_family_and_holds_its_validated_config():
    for name in keras_attnconv.list_models():
        card = keras_attnconv.get_model_card(name)
        assert card.name == name and card.config is keras_attnconv.get_model_config(name)
        assert card.family == type(keras_attnconv.build_model(name, **small_overrides(name))).__name__


@pytest.mark.parametrize(
    "arguments, message",
    [
        (("quadratic", keras_attnconv.get_model_config("quadratic")), "registered as 'quadratic' already"),
        (("Quadratic2", keras_attnconv.get_model_config("quadratic")), "name='Quadratic2'"),
        (("../x", keras_attnconv.get_model_config("quadratic")), "name='../x'"),
        (("new_model", {"num_layers": 2}), "config of class dict"),
    ],
)
def test_register_model_refuses_a_taken_or_bad_name_and_what_is_not_a_config(arguments, message):
    paper = keras_attnconv.models.PaperFigures("a row")
    with pytest.raises(ValueError, match=message):
        keras_attnconv.register_model(*arguments, paper)
    assert "new_model" not in keras_attnconv.list_models()


def test_from_preset_of_a_name_warns_that_its_weights_are_initial_unless_load_weights_false_asks_for_them():
    # keras-hub's from_preset(name) loads trained weights; the package ships none, so a name's model is new.
    import warnings

    with pytest.warns(
        UserWarning, match="'resnet_tiny' is a registered model name, and the package ships no trained"
    ) as caught:
        warned = keras_attnconv.from_preset("resnet_tiny", num_classes=3)
    assert caught[0].filename == __file__  # the caller's line, not the package's
    assert warned.name == "resnet_tiny" and warned.config.num_classes == 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fresh = keras_attnconv.from_preset("resnet_tiny", load_weights=False)
    assert not [w for w in caught if "trained weights" in str(w.message)]  # asked for: not warned
    assert fresh.name == "resnet_tiny" and fresh.config == keras_attnconv.get_model_config("resnet_tiny")
    with pytest.raises(ValueError, match="must be true or false. Received: load_weights='no'"):
        keras_attnconv.from_preset("resnet_tiny", load_weights="no")


def test_build_model_takes_a_preset_directory_and_a_registered_name_comes_first(tmp_path, monkeypatch):
    model = keras_attnconv.build_model("resnet_tiny", image_size=8, seed=1)
    monkeypatch.chdir(tmp_path)
    keras_attnconv.save_to_preset(model, "resnet_tiny")  # a directory named as a registered model

    by_name = keras_attnconv.build_model("resnet_tiny")
    by_path = keras_attnconv.build_model("./resnet_tiny")

    assert by_name.config.image_size == 32  # the registered configuration, new weights
    assert by_path.config == model.config
    for saved, loaded in zip(model.get_weights(), by_path.get_weights()):
        np.testing.assert_array_equal(saved, loaded)
    with pytest.raises(
        ValueError,
        match="takes only `dtype`, `load_weights`, and for a new classification head `num_classes` and "
        "`class_names`. Received: image_size=16, seed=1",
    ):
        keras_attnconv.build_model("./resnet_tiny", num_classes=3, image_size=16, seed=1)
    with pytest.raises(ValueError, match="`load_weights` is for a preset directory.*Received: load_weights=False"):
        keras_attnconv.build_model("resnet_tiny", load_weights=False)
    with pytest.raises(
        ValueError, match="Unknown model 'resnet_tin'.*or a preset directory. Received: name='resnet_tin'"
    ):
        keras_attnconv.build_model("resnet_tin")
    # from_preset names its own argument.
    with pytest.raises(
        ValueError, match="Unknown model 'resnet_tin'.*or a preset directory. Received: preset='resnet_tin'"
    ):
        keras_attnconv.from_preset("resnet_tin")
