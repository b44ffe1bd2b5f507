"""A model of the zoo knows what it is: its class and constructor arguments (its config), its preprocessing and
class names, saved with it and back after a plain ``import keras_attnconv``; it takes uint8 images."""

import dataclasses
import os
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
from keras import ops
from support import assert_same_weights_but_the_head, requires_tensorflow, traced_steps, walk_modules

from keras_attnconv import AttentionClassifier, ResNet, build_model, get_model_config
from keras_attnconv.layers.encoder import encoder_blocks
from keras_attnconv.models import AttentionClassifierConfig, ResNetConfig
from keras_attnconv.models.attention_classifier import with_attention_options

SMALL = {"num_layers": 1, "hidden_dim": 8, "intermediate_dim": 8, "image_size": 8}


def pixels(count=2, size=8):
    return np.random.default_rng(0).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


@pytest.mark.parametrize(
    "model_class, config_class, fields",
    [
        (AttentionClassifier, AttentionClassifierConfig, {**SMALL, "num_heads": (2,)}),
        (ResNet, ResNetConfig, {"image_size": 8, "blocks_per_stage": (1,), "widths": (4,)}),
    ],
)
def test_get_config_is_exactly_the_constructor_arguments(model_class, config_class, fields):
    model = model_class(**fields, name="mine", dtype="mixed_bfloat16")
    config = model.get_config()
    assert set(config) == {f.name for f in dataclasses.fields(config_class)} | {"name", "trainable", "dtype"}
    assert {k: config[k] for k in fields} == fields and (config["name"], config["dtype"]) == ("mine", "mixed_bfloat16")
    again = model_class(**config)
    assert again.get_config() == config and again.config == model.config


def test_build_model_returns_the_familys_class_under_the_registered_name():
    assert type(build_model("quadratic_tiny", **SMALL)) is AttentionClassifier
    assert type(build_model("resnet_tiny", image_size=8)) is ResNet
    assert build_model("learned_tiny", **SMALL).name == "learned_tiny"


RELOAD = """
import sys
import numpy as np
{imports}
model = keras.saving.load_model(sys.argv[1])
print(type(model).__name__, model.name, model.class_names[0], model.config.pixel_std[0])
np.save(sys.argv[2], keras.ops.convert_to_numpy(model(np.load(sys.argv[3]))))
"""


# The first reloads on each backend in a fresh process; the other orders of imports are the same Python on every
# backend, checked on TensorFlow's pass.
_same_on_every_backend = pytest.mark.backend_independent


@pytest.mark.parametrize(
    "imports",
    [
        "import keras_attnconv, keras",
        pytest.param("import keras\nimport keras_attnconv", marks=_same_on_every_backend),
        # a submodule first: Keras is imported while that module (and, for
        # models, the layers it imports) is still being imported
        pytest.param("from keras_attnconv.layers import QuadraticScore\nimport keras", marks=_same_on_every_backend),
        pytest.param("from keras_attnconv.models import build_model\nimport keras", marks=_same_on_every_backend),
        pytest.param("from keras_attnconv.optim import WarmupCosineDecay\nimport keras", marks=_same_on_every_backend),
    ],
)
def test_a_keras_file_reloads_after_a_plain_import_in_either_order(imports, tmp_path):
    model = build_model(
        "quadratic_tiny", seed=0, class_names=[f"c{i}" for i in range(10)], pixel_std=(0.3, 0.3, 0.3), **SMALL
    )
    model.save(tmp_path / "model.keras")
    np.save(tmp_path / "pixels.npy", pixels())
    script = textwrap.dedent(RELOAD.format(imports=imports))
    result = subprocess.run(
        [
            sys.executable,
            "-W",
            "error::UserWarning",
            "-c",
            script,
            str(tmp_path / "model.keras"),
            str(tmp_path / "out.npy"),
            str(tmp_path / "pixels.npy"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["AttentionClassifier", "quadratic_tiny", "c0", "0.3"]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), ops.convert_to_numpy(model(pixels())))


def test_the_model_normalises_the_pixels_with_its_own_statistics():
    model = build_model("resnet_tiny", image_size=8, pixel_mean=(0.5, 0.25, 0.75), pixel_std=(0.5, 0.25, 0.125))
    x = pixels()
    normalised = keras.Model(model.input, model.get_layer("pixel_normalization").output)(x)
    expected = (x.astype("float64") / 255 - [0.5, 0.25, 0.75]) / [0.5, 0.25, 0.125]
    np.testing.assert_allclose(ops.convert_to_numpy(normalised), expected, rtol=1e-6, atol=1e-6)
    assert model.preprocessing["normalization"] == {"mean": [0.5, 0.25, 0.75], "std": [0.5, 0.25, 0.125]}


@pytest.mark.parametrize(
    "images", [np.zeros((1, 8, 8, 3), "float32"), np.zeros((1, 8, 8, 3), "int32")], ids=["float32", "int32"]
)
def test_images_other_than_uint8_pixels_are_refused(images):
    # A normalised float image would be cast to uint8 and classified as something else, silently.
    model = build_model("quadratic_tiny", **SMALL)
    dtype = images.dtype.name
    with pytest.raises(ValueError, match=f"takes uint8 images.*Received: images of dtype {dtype}"):
        model(images)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=f"Received: images of dtype {dtype}"):
        model.fit(images, np.zeros(1), verbose=0)


@pytest.mark.parametrize("name", ["quadratic_tiny", "resnet_tiny"])
@pytest.mark.parametrize("channels", [1, 4])
def test_images_of_another_channel_count_are_refused_naming_both(name, channels):
    # A grayscale batch used to be broadcast over the 3 channels and classified, silently.
    model = build_model(name, **(SMALL if name == "quadratic_tiny" else {"image_size": 8}))
    with pytest.raises(ValueError, match=f"takes RGB images, 3 channels.*Received: .*{channels} channels"):
        model(np.zeros((2, 8, 8, channels), np.uint8))
    with pytest.raises(ValueError, match=f"{channels} channels"):
        model.predict(np.zeros((2, 8, 8, channels), np.uint8), verbose=0)


@pytest.mark.parametrize("name", ["quadratic_tiny", "resnet_tiny"])
@pytest.mark.parametrize("size", [6, 16])
def test_images_of_another_size_are_refused_naming_both(name, size):
    # On JAX, `predict` and `fit` call `call` without Keras' input check: the attention model used to take the
    # other grid, and both families to answer for images of a size they never saw.
    model = build_model(name, **(SMALL if name == "quadratic_tiny" else {"image_size": 8}))
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images = np.zeros((2, size, size, 3), np.uint8)
    message = r"takes 8x8 images, the size it was built for.*Received: images of shape \({batch}, {size}, {size}, 3\)"
    with pytest.raises(ValueError, match=message.format(batch=2, size=size)):
        model(images)
    with pytest.raises(ValueError, match=message.format(batch=2, size=size)):
        model.predict(images, verbose=0)
    with pytest.raises(ValueError, match=message.format(batch="(?:2|None)", size=size)):  # TensorFlow: traced
        model.fit(images, np.zeros(2), verbose=0)


class _Batches(keras.utils.PyDataset):
    """Batches of (images, labels). Those at the indices `refused` have 6x6 images, which the 8x8 model refuses,
    or with `refused_part="labels"`, labels of rank 3, which the loss refuses when the step is traced."""

    def __init__(self, refused=(), count=2, refused_part="images"):
        super().__init__()
        self.refused, self.count, self.refused_part = refused, count, refused_part

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        refused = index in self.refused
        images = pixels(size=6 if refused and self.refused_part == "images" else 8)
        return images, np.zeros((len(images), 2, 2) if refused and self.refused_part == "labels" else len(images))


def _compiled_small_model():
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(True),
        # JAX's compiled step is what consumes the values; TensorFlow's tf.function fails alike without XLA,
        # whose compilations would take most of these tests' time there.
        jit_compile=keras.backend.backend() == "jax",
    )
    return model


@pytest.mark.parametrize("refused", [0, 1], ids=["first batch", "second batch"])
@pytest.mark.parametrize("call", ["predict", "evaluate", "fit", "first fit"])
def test_a_refused_batch_leaves_the_model_as_it_was(call, refused):
    # On JAX, Keras' trainer detaches the weights while it runs and gives each step's values to the next step:
    # an error used to leave the model without them ("'NoneType' object is not callable" at the next call), a
    # trained model's weights lost; the values before the call are no use after a step, which consumed them.
    model = _compiled_small_model()
    if call != "first fit":  # else the optimizer's and the metrics' variables are made by the refused call
        model.fit(_Batches(), verbose=0)
    weights, logits = model.get_weights(), model.predict(pixels(), verbose=0)
    with pytest.raises(ValueError, match="takes 8x8 images"):
        getattr(model, call.split()[-1])(_Batches(refused=[refused]), verbose=0)
    if "fit" in call and refused:  # a step trained before the refused batch, and the model keeps it
        assert np.isfinite(model.predict(pixels(), verbose=0)).all()
    else:
        for before, after in zip(weights, model.get_weights()):
            np.testing.assert_array_equal(before, after)
        np.testing.assert_array_equal(model.predict(pixels(), verbose=0), logits)
    model.fit(_Batches(), verbose=0)  # and it trains on
    assert np.isfinite(model.evaluate(pixels(), np.zeros(2), verbose=0)).all()


def test_a_first_fit_refused_while_its_step_is_traced_leaves_the_model_able_to_train():
    # On TensorFlow, the first trace of a PyDataset's step creates the optimizer's variables: a first fit
    # failing in that trace made every next fit fail ("Creating variables on a non-first call").
    model = _compiled_small_model()
    weights = model.get_weights()
    # The loss's words: TensorFlow's check of the labels' rank (PyTorch's with its eager shape), JAX's squeeze of
    # their last axis.
    with pytest.raises(ValueError, match=r"target.shape=(\(None|torch.Size\(\[2), 2, 2\]?\)|got shape=\(2, 2\)"):
        model.fit(_Batches(refused=range(2), refused_part="labels"), verbose=0)
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)
    model.fit(_Batches(), verbose=0)
    assert np.isfinite(model.evaluate(pixels(), np.zeros(2), verbose=0)).all()


def _float_batches(float_at, batch_count=3):
    """(images, labels) batches: uint8 pixels, and at `float_at` the same pixels scaled to [0, 1] as float32."""
    for index in range(batch_count):
        images = pixels()
        yield (images.astype("float32") / 255 if index == float_at else images), np.zeros(len(images))


class _FloatBatches(keras.utils.PyDataset):
    def __init__(self, float_at):
        super().__init__()
        self.batches = list(_float_batches(float_at))

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        return self.batches[index]


@pytest.mark.parametrize("float_at", [1, 2], ids=["second batch", "third batch"])
@pytest.mark.parametrize("source", [_float_batches, _FloatBatches], ids=["generator", "PyDataset"])
@pytest.mark.parametrize("call", ["predict", "evaluate", "fit", "fit's validation"])
def test_a_python_batch_of_float_images_after_uint8_ones_is_refused_not_cast(call, source, float_at):
    # On TensorFlow, Keras' tf.data pipeline for a generator or a PyDataset takes its dtype from the first two
    # batches and cast a later float batch to uint8, silently: pixels in [0, 1] became black images.
    model = _compiled_small_model()
    error = ValueError
    if keras.backend.backend() == "tensorflow" and float_at == 2:  # after the two Keras reads ahead, in tf.data
        import tensorflow as tf

        error = tf.errors.InvalidArgumentError  # TensorFlow's report of an error of the Python batches
    with pytest.raises(error, match="takes uint8 images.*Received: images of dtype float32"):
        if call == "fit's validation":
            model.fit(pixels(), np.zeros(2), validation_data=source(float_at), verbose=0)
        elif call == "fit":
            model.fit(source(float_at), shuffle=False, verbose=0)  # a generator's batches come in its own order
        else:
            getattr(model, call)(source(float_at), verbose=0)


@pytest.mark.parametrize("name", ["quadratic_tiny", "resnet_tiny"])
def test_a_batch_of_no_images_is_refused_by_every_family_alike(name):
    # A ResNet's batch normalisation used to fail with a message about its input's channels.
    model = build_model(name, **(SMALL if name == "quadratic_tiny" else {"image_size": 8}))
    with pytest.raises(ValueError, match=r"got no images to classify. Received: images of shape \(0, 8, 8, 3\)"):
        model(np.zeros((0, 8, 8, 3), np.uint8))


def test_class_names_default_to_cifar10s_or_the_indices():
    assert build_model("resnet_tiny", image_size=8).class_names[:2] == ("airplane", "automobile")
    assert build_model("resnet_tiny", image_size=8, num_classes=3).class_names == ("0", "1", "2")


def test_attention_options_make_a_new_configuration_with_the_same_weights(tmp_path):
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    general = with_attention_options(model, separable=False)
    assert general.config.attention_options == {"separable": False} and general.name == model.name
    assert general.get_layer("encoder_0").attention.attention_mode == "position"
    for a, b in zip(model.get_weights(), general.get_weights()):
        np.testing.assert_array_equal(a, b)
    general.save(tmp_path / "general.keras")
    assert keras.saving.load_model(tmp_path / "general.keras").get_layer("encoder_0").attention.attention_mode == (
        "position"
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(general(pixels())), ops.convert_to_numpy(model(pixels())), atol=1e-5
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"class_names": ["a", "b"]}, "10 distinct non-empty strings.*class_names=\\['a', 'b'\\]"),
        ({"class_names": "abcdefghij"}, "class_names='abcdefghij'"),
        ({"class_names": ["a"] * 10}, "distinct"),
        ({"class_names": np.array([[str(i)] for i in range(10)])}, "1-D array.*class_names=\\[\\['0'\\], \\['1'\\]"),
        ({"pixel_std": (0.2, 0.0, 0.2)}, "pixel_std=0.0"),
        ({"pixel_std": (0.2, 0.2)}, "one number per RGB channel.*pixel_std=\\(0.2, 0.2\\)"),
        ({"pixel_mean": (0.5, float("nan"), 0.5)}, "pixel_mean=nan"),
        ({"pixel_std": (1e-50, 0.2, 0.2)}, "`pixel_std` must be a number float32 can hold.*pixel_std=\\(1e-50"),
        ({"pixel_mean": (1e39, 0.2, 0.2)}, "`pixel_mean` must be a number float32 can hold.*pixel_mean=\\(1e\\+39"),
        ({"attention_options": {"separable": False, "key_dim": 4}}, "may set.*key_dim"),
        ({"attention_options": {"seperable": False}}, "Did you mean 'separable'"),
        # Values, by the layer that takes them, when the config is made (not when the layers are built).
        ({"attention_options": {"separable": "maybe"}}, "Invalid `attention_options`.*Received: separable='maybe'"),
        ({"attention_options": {"content_scale": -1.0}}, "Received: content_scale=-1.0"),
        ({"attention_options": {"bias_initializer": "bogus"}}, "Received: bias_initializer='bogus'"),
        ({"attention_options": {"windowed": True}}, "needs a `window`"),
    ],
)
def test_bad_preprocessing_and_options_are_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_model("quadratic_tiny", **SMALL, **overrides)
    with pytest.raises(ValueError, match=message):  # the config alone, as a recipe's model_overrides are checked
        get_model_config("quadratic_tiny", **overrides)


def test_an_unknown_constructor_argument_is_named():
    with pytest.raises(ValueError, match="Unknown AttentionClassifier field 'num_layer'.*Did you mean 'num_layers'"):
        AttentionClassifier(num_layer=2)


def test_predicting_no_images_is_named():
    with pytest.raises(ValueError, match=r"got no images to predict. Received: x of shape \(0, 8, 8, 3\)"):
        build_model("quadratic_tiny", **SMALL).predict(np.zeros((0, 8, 8, 3), np.uint8), verbose=0)


def test_class_names_may_be_a_1d_array_of_strings():
    names = np.array([f"c{i}" for i in range(10)])
    assert build_model("quadratic_tiny", class_names=names, **SMALL).class_names == tuple(names.tolist())


@pytest.mark.parametrize(
    "images, received",
    [
        ([pixels(1)[0], pixels(1)[0]], r"a list of 2 items \(\(8, 8, 3\), \(8, 8, 3\)\)"),
        (pixels(1)[0], r"an array of shape \(8, 8, 3\)"),
    ],
    ids=["list of images", "one image without its batch axis"],
)
def test_images_other_than_one_batch_array_are_named(images, received):
    model = build_model("quadratic_tiny", **SMALL)
    message = rf"takes one uint8 array of images \(batch, 8, 8, 3\).*Received: images={received}"
    with pytest.raises(ValueError, match=message):
        model(images)
    with pytest.raises(ValueError, match="takes one uint8 array of images"):
        model.predict(images, verbose=0)


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        ("learned_content_local_tiny", {"image_size": 100000}, "One image's feature maps.*image_size=100000"),
        (
            "quadratic_tiny",
            {"num_classes": 10**9},
            "The logits kernel would take about 179 GiB.*num_classes=1000000000",
        ),
        ("quadratic_tiny", {"intermediate_dim": 10**9}, "feed-forward kernel.*intermediate_dim=1000000000"),
        ("quadratic_tiny", {"num_layers": 10**7}, "The weights.*num_layers=10000000"),
        ("absolute_learned_tiny", {"image_size": 512}, "attention scores would take about 144 GiB.*image_size=512"),
        ("resnet_tiny", {"widths": (16, 32, 10**6)}, r"A convolution kernel.*widths=\(16, 32, 1000000\)"),
        ("resnet_tiny", {"num_classes": 10**9}, "The logits kernel.*num_classes=1000000000"),
    ],
)
def test_sizes_beyond_the_limit_are_named_before_anything_is_allocated(name, overrides, message):
    # Each used to allocate tens of GiB in the config check, or to end in an out-of-memory error naming nothing.
    with pytest.raises(ValueError, match=message):
        get_model_config(name, **overrides)


def test_large_images_with_a_window_or_separable_heads_stay_within_the_limit():
    # Neither forms a (tokens x tokens) table per image: the estimate follows the path the layers take.
    for name in ("quadratic", "learned_content_local", "quadratic_span_local"):
        get_model_config(name, image_size=256)


def test_compile_alone_trains_the_logits_with_a_from_logits_loss_and_accuracy():
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    model.compile()
    assert isinstance(model.optimizer, keras.optimizers.Adam)
    history = model.fit(pixels(20), np.arange(20) % 10, epochs=1, verbose=0).history
    # Crossentropy of near-uniform logits over 10 classes is about ln(10) = 2.3; read as probabilities, 8 to 9.
    assert abs(history["loss"][0] - np.log(10)) < 0.5 and "accuracy" in history


@pytest.mark.parametrize(
    "loss",
    [
        "sparse_categorical_crossentropy",
        "categorical_crossentropy",
        "SparseCategoricalCrossentropy",
        keras.losses.sparse_categorical_crossentropy,
        keras.losses.SparseCategoricalCrossentropy(),
        keras.losses.CategoricalCrossentropy(from_logits=False),
        [keras.losses.SparseCategoricalCrossentropy()],
    ],
    ids=lambda loss: getattr(loss, "__name__", None) or type(loss).__name__ + repr(loss)[:40],
)
def test_a_loss_that_reads_the_logits_as_probabilities_is_refused(loss):
    model = build_model("quadratic_tiny", **SMALL)
    with pytest.raises(
        ValueError, match="outputs logits, and this loss would read them as probabilities.*Received: loss="
    ):
        model.compile("sgd", loss)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # the one meant


@pytest.mark.parametrize(
    "labels, keyword, label",
    [(np.arange(4) + 7, "y", 10), (np.array([0, -1, 2, 3]), "y", -1), (np.array([0, 1, 2, 12]), "validation_data", 12)],
)
def test_a_label_out_of_range_in_fit_names_the_label_and_the_number_of_classes(labels, keyword, label):
    model = build_model("quadratic_tiny", **SMALL)
    model.compile()
    y, validation = (labels, None) if keyword == "y" else (np.zeros(4, int), (pixels(4), labels))
    with pytest.raises(
        ValueError,
        match=rf"has 10 classes: labels must lie in \[0, 10\). "
        rf"Received: {keyword} with the label {label}",
    ):
        model.fit(pixels(4), y, validation_data=validation, epochs=1, verbose=0)


@pytest.mark.parametrize("name, fields", [("quadratic_tiny", SMALL), ("resnet_tiny", {"image_size": 8})])
def test_clone_model_gives_the_same_class_and_config_with_new_weights(name, fields):
    model = build_model(name, class_names=[f"c{i}" for i in range(10)], dtype="mixed_bfloat16", **fields)
    model.compile()
    clone = keras.models.clone_model(model)
    assert type(clone) is type(model) and clone.get_config() == model.get_config()
    assert clone.class_names == model.class_names and clone.dtype_policy.name == "mixed_bfloat16"
    assert isinstance(clone.loss, keras.losses.SparseCategoricalCrossentropy) and clone.loss.get_config()["from_logits"]
    with pytest.raises(ValueError, match="takes uint8 images"):
        clone(np.zeros((1, 8, 8, 3), "float32"))
    assert ops.convert_to_numpy(clone(pixels())).shape == (2, 10)
    assert any(not np.array_equal(a, b) for a, b in zip(clone.get_weights(), model.get_weights()))


def test_a_trained_model_reloads_compiled_without_a_warning(tmp_path):
    # Keras skips compiling a model whose class has its own `compile`, with a warning, unless it loads its config.
    model = build_model("quadratic_tiny", **SMALL)
    model.compile()
    model.fit(pixels(), np.array([0, 1]), epochs=1, verbose=0)
    model.save(tmp_path / "model.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.compiled and loaded.loss.get_config()["from_logits"]


def test_compile_alone_fits_one_hot_labels_with_a_categorical_loss_too():
    model = build_model("quadratic_tiny", **SMALL)
    model.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=True))  # the default metrics follow the labels
    history = model.fit(pixels(), np.eye(10)[[0, 1]], epochs=1, verbose=0).history
    assert "accuracy" in history


@requires_tensorflow
@pytest.mark.parametrize("labels", ["sparse", "one-hot"])
@pytest.mark.parametrize("feed", ["arrays", "tf.data"])
def test_fit_and_evaluate_trace_their_step_once_on_tensorflow(feed, labels):
    """Keras' TensorFlow trainer creates the optimizer and metric variables in the first trace of a step, which
    TensorFlow then traces again: the model creates them before, from the shapes of the data (`training_state`)."""
    import tensorflow as tf

    y = np.arange(4) % 10 if labels == "sparse" else np.eye(10, dtype="float32")[np.arange(4)]
    data = (
        {"x": pixels(4), "y": y}
        if feed == "arrays"
        else {"x": tf.data.Dataset.from_tensor_slices((pixels(4), y)).batch(2)}
    )
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    loss = keras.losses.SparseCategoricalCrossentropy if labels == "sparse" else keras.losses.CategoricalCrossentropy
    model.compile("sgd", loss(from_logits=True), jit_compile=False)
    traces = traced_steps(model)
    history = model.fit(**data, batch_size=2 if feed == "arrays" else None, epochs=2, shuffle=False, verbose=0).history
    assert traces == {"train": 1, "test": 0} and len(history["accuracy"]) == 2
    # The metric follows the labels: accuracy of the 4 images, whichever form their labels take.
    logits = keras.ops.convert_to_numpy(model.predict(pixels(4), verbose=0))
    _, accuracy = model.evaluate(**data, verbose=0)
    assert traces == {"train": 1, "test": 1} and accuracy == pytest.approx(np.mean(logits.argmax(-1) == np.arange(4)))


@requires_tensorflow
def test_train_on_batch_traces_its_step_once_on_tensorflow():
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    model.compile("sgd", jit_compile=False)
    traces = traced_steps(model)
    losses = [model.train_on_batch(pixels(4), np.arange(4)) for _ in range(2)]
    assert traces == {"train": 1, "test": 0} and np.isfinite(losses).all()


@pytest.mark.parametrize("change", [{"hidden_dim": 16}, {"num_layers": 2}], ids=["a weight's shape", "a layer more"])
def test_with_config_that_changes_a_weights_shape_is_named(change):
    (key, value), *_ = change.items()
    with pytest.raises(ValueError, match=f"must keep every weight's shape.*Received: {key}={value}"):
        build_model("quadratic_tiny", **SMALL).with_config(**change)


@pytest.mark.parametrize("name", ["quadratic_tiny", "resnet_tiny"])
def test_with_config_of_another_number_of_classes_gives_a_new_head_on_the_same_features(name):
    model = build_model(name, seed=0, image_size=8)
    tuned = model.with_config(num_classes=3, class_names=["cat", "dog", "owl"])
    assert tuned.class_names == ("cat", "dog", "owl") and tuned.name == name
    assert tuned.get_layer("logits").kernel.shape == (model.get_layer("logits").kernel.shape[0], 3)
    assert_same_weights_but_the_head(tuned, model)
    images = pixels(4)
    features = keras.Model(model.inputs, model.get_layer("pool").output)
    head = tuned.get_layer("logits")
    np.testing.assert_allclose(
        tuned.predict(images, verbose=0),
        ops.convert_to_numpy(head(features.predict(images, verbose=0))),
        rtol=1e-5,
        atol=1e-6,
    )
    tuned.compile(keras.optimizers.SGD(0.1))
    assert np.isfinite(tuned.fit(images, np.arange(4) % 3, epochs=1, verbose=0).history["loss"]).all()
    assert model.with_config(num_classes=4).class_names == ("0", "1", "2", "3")  # not the old classes' names
    renamed = model.with_config(class_names=[f"class {i}" for i in range(10)])  # the same classes: the same head
    for kept, trained in zip(renamed.get_layer("logits").get_weights(), model.get_layer("logits").get_weights()):
        np.testing.assert_array_equal(kept, trained)


def documented_score_module():
    """The score module of docs/architecture.md's walk, as it stands (it registers "manhattan")."""
    return walk_modules()["my_scores.py"]


@pytest.fixture
def manhattan_score(tmp_path, monkeypatch):
    """Imports the documented score module from a file (it registers "manhattan"); removed again after the test."""
    import importlib

    from keras_attnconv.layers import POSITION_SCORES

    (tmp_path / "my_manhattan_score.py").write_text(documented_score_module())
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield importlib.import_module("my_manhattan_score").ManhattanScore
    finally:
        POSITION_SCORES.pop("manhattan", None)
        sys.modules.pop("my_manhattan_score", None)


@pytest.mark.parametrize(
    "build",
    [
        lambda: build_model("quadratic_tiny", position_score="manhattan", **SMALL),
        lambda: AttentionClassifier(position_score="manhattan", num_heads=2, **SMALL),
        lambda: get_model_config("quadratic_tiny", position_score="manhattan", **SMALL).build(),
    ],
)
def test_a_position_score_registered_the_documented_way_is_taken_by_the_models(manhattan_score, build):
    model = build()
    scores = [block.attention.position_score for block in encoder_blocks(model)]
    assert scores and all(isinstance(score, manhattan_score) for score in scores)
    logits = keras.ops.convert_to_numpy(model(pixels()))
    assert logits.shape == (2, 10) and np.isfinite(logits).all()
    with pytest.raises(
        ValueError, match="`position_score` must be one of .*'manhattan'.* Received: position_score='manhatan'"
    ):
        build_model("quadratic_tiny", position_score="manhatan", **SMALL)
