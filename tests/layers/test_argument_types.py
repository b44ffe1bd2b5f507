"""Every boolean, integer and float argument of every public layer and config is checked by the package's own checks:
a string ("false", "3", "0.5") is refused with an error naming the argument (never taken as true, or cast), and
NumPy scalars of the right kind are valid numbers."""

import dataclasses
import inspect

import numpy as np
import pytest

import keras_attnconv.layers as layers
from keras_attnconv.models import AttentionClassifierConfig, ResNetConfig
from keras_attnconv.training.recipe import TrainConfig

#: The arguments each class needs to be made at all (the others keep their defaults).
REQUIRED = {
    layers.RelativeMultiHeadAttention: {"num_heads": 2},
    layers.TransformerEncoderBlock: {"num_heads": 2, "intermediate_dim": 8},
    layers.QuadraticScore: {"num_heads": 2},
    layers.GaussianScore: {"num_heads": 2},
    layers.DiagonalGaussianScore: {"num_heads": 2},
    layers.LearnedRelativeScore: {"num_heads": 2, "embedding_dim": 4},
    layers.SirenScore: {"num_heads": 2},
    layers.AttentionSpan: {"num_heads": 2},
    layers.InvertibleDownsampling: {},
    layers.LearnedPositionEmbedding: {},
    layers.SinusoidalPositionEmbedding: {},
    layers.PixelNormalization: {"mean": (0.5, 0.5, 0.5), "std": (0.2, 0.2, 0.2)},
    AttentionClassifierConfig: {},
    ResNetConfig: {},
    TrainConfig: {},
}


def defaults(cls):
    """{argument: default} of the class's own arguments with a bool, int or float default."""
    if dataclasses.is_dataclass(cls):
        pairs = [(f.name, f.default) for f in dataclasses.fields(cls)]
    else:
        pairs = [(name, p.default) for name, p in inspect.signature(cls.__init__).parameters.items()]
    return {name: value for name, value in pairs if type(value) in (bool, int, float)}


CASES = [(cls, name, default) for cls in REQUIRED for name, default in defaults(cls).items()]


def make(cls, **arguments):
    return cls(**{**REQUIRED[cls], **arguments})


def case_id(case):
    return f"{case[0].__name__}-{case[1]}" if isinstance(case, tuple) else None


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_string_is_refused_by_name(case):
    cls, name, default = case
    text = str(default).lower()  # "false", "3", "0.1": what a config file or a command line would hand over
    with pytest.raises(ValueError, match=f"{name}={text!r}"):
        make(cls, **{name: text})


@pytest.mark.parametrize("case", [c for c in CASES if type(c[2]) is not bool], ids=case_id)
def test_a_numpy_scalar_of_the_right_kind_is_accepted(case):
    cls, name, default = case
    make(cls, **{name: (np.int64 if type(default) is int else np.float32)(default)})


def test_every_class_with_such_arguments_is_covered():
    # Guards the introspection itself: the classes whose arguments are all required or objects have none.
    assert {cls for cls, _, _ in CASES} == set(REQUIRED) - {layers.LearnedPositionEmbedding, layers.PixelNormalization}


def test_numpy_numbers_in_a_config_become_python_numbers():
    config = AttentionClassifierConfig(num_layers=np.int64(2), dropout=np.float32(0.25), num_classes=np.int32(3))
    assert (type(config.num_layers), type(config.dropout), type(config.num_classes)) == (int, float, int)
    assert config.dropout == 0.25 and TrainConfig(epochs=np.int64(3)).epochs.__class__ is int


@pytest.mark.parametrize(
    "layer",
    [
        layers.RelativeMultiHeadAttention(2),
        layers.TransformerEncoderBlock(2, 8),
        layers.PixelNormalization((0.5,) * 3, (0.2,) * 3),
    ],
    ids=lambda layer: type(layer).__name__,
)
def test_complex_inputs_are_refused(layer):
    import keras

    x = keras.ops.cast(keras.ops.ones((1, 4, 4, 3)), "complex64")
    with pytest.raises(ValueError, match="must be real numbers.*Received: inputs of dtype complex64"):
        layer(x)


@pytest.mark.parametrize("value", [float("nan"), -0.5, 0.0, "bogus"])
def test_an_alpha_initializer_that_would_give_nan_or_no_attention_is_refused(value):
    with pytest.raises(ValueError, match=f"alpha_initializer={value!r}"):
        layers.QuadraticScore(2, alpha_initializer=value)
    layers.QuadraticScore(2, alpha_initializer="ones")  # a Keras initializer stays valid


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: layers.TransformerEncoderBlock(2, 8, activation="bogus"), "activation"),
        (lambda: layers.TransformerEncoderBlock(2, 8, kernel_initializer="bogus"), "kernel_initializer"),
        (lambda: layers.RelativeMultiHeadAttention(2, bias_initializer="bogus"), "bias_initializer"),
        (lambda: layers.LearnedPositionEmbedding(initializer="bogus"), "initializer"),
        (lambda: layers.LearnedRelativeScore(2, 4, embeddings_initializer="bogus"), "embeddings_initializer"),
    ],
)
def test_unknown_initializer_and_activation_names_are_named(make, argument):
    with pytest.raises(ValueError, match=f"`{argument}` must be a Keras .* Received: {argument}='bogus'"):
        make()
