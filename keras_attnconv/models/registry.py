"""The model zoo's registry: it collects the names the families register, lists them and builds them.

A family (a folder of `keras_attnconv.models`) registers each of its named
configurations with `register_model` when it is imported; nothing here
names a family. `build_model` is the one entry point: it takes a registered
name or a preset directory (`from_preset` is its alias).
"""

import dataclasses
import fnmatch
import os
import warnings

import keras

from keras_attnconv.models.image_classifier import ClassifierConfig, ImageClassifier
from keras_attnconv.models.model_card import ModelCard, PaperFigures, TrainedResult
from keras_attnconv.models.presets import check_preset_class, load_preset
from keras_attnconv.models.validation import dtype_policy
from keras_attnconv.utils.checks import check_bool, check_registered_name, check_seed, did_you_mean

#: The fields a preset takes (`build_model`, `from_preset`): a new classification head (`ImageClassifier.with_config`).
HEAD_FIELDS = ("num_classes", "class_names")

_REGISTRY = {}


def register_model(name, config, paper, trained=()):
    """Registers `config` under `name` with its figures; returns its `ModelCard`.

    Args:
        name: lower-case letters, digits and underscores, starting with a letter; not registered yet.
        config: a family's config (a `ClassifierConfig`; the family's `ImageClassifier` subclass builds it).
        paper: its `PaperFigures`.
        trained: `TrainedResult`s of this package's runs of it, most recent last.
    """
    check_registered_name("name", name)
    if name in _REGISTRY:
        raise ValueError(
            f"A model is registered as {name!r} already (a {type(_REGISTRY[name].config).__name__}). "
            f"Received: name={name!r}"
        )
    if not isinstance(config, ClassifierConfig):
        raise ValueError(
            "`config` must be a model family's config (a ClassifierConfig). "
            f"Received: config of class {type(config).__name__}"
        )
    if not isinstance(paper, PaperFigures) or not all(isinstance(t, TrainedResult) for t in trained):
        raise ValueError(
            f"`paper` must be PaperFigures and `trained` TrainedResults. Received: paper={paper!r}, trained={trained!r}"
        )
    card = ModelCard(name, config, paper, tuple(trained))
    _REGISTRY[name] = card
    return card


def list_models(pattern="*"):
    """Registered names matching the glob `pattern` (``list_models("quadratic*")``).

    The configurations of the paper and its follow-ups come first, then the small variants
    (``source="ours"``), each in the order their families registered them.
    """
    if not isinstance(pattern, str):
        raise ValueError(f"`pattern` must be a glob pattern string, e.g. 'quadratic*'. Received: pattern={pattern!r}")
    names = [name for name in _REGISTRY if fnmatch.fnmatchcase(name, pattern)]
    return sorted(names, key=lambda name: _REGISTRY[name].paper.source == "ours")


def get_model_card(name, *, or_else="", argument="name"):
    """The `ModelCard` registered under `name`: its config, paper figures and trained results.

    ``or_else``: what else the caller would have taken, for the error (``" or a preset directory"``).
    ``argument``: what the caller's user called the name, for the error (``"model"``: a recipe's field and
    ``--model``, beside a run's or an export's own ``--name``).
    """
    if not isinstance(name, str):  # a list would not even hash
        raise ValueError(
            f"`{argument}` must be a model name, one of list_models(){or_else}. Received: {argument}={name!r}"
        )
    if name not in _REGISTRY:
        raise ValueError(
            f"Unknown model {name!r}.{did_you_mean(name, _REGISTRY)} Available: {', '.join(_REGISTRY)}"
            f"{or_else}. Received: {argument}={name!r}"
        )
    return _REGISTRY[name]


def get_model_config(name, **overrides):
    """The frozen config registered under `name`, with `overrides` applied and validated (once)."""
    config = get_model_card(name).config
    if not overrides:
        return config
    return type(config).from_fields({**dataclasses.asdict(config), **overrides}, f"model {name!r}")


def get_paper_figures(name):
    """The paper's row, parameter count, FLOPs and accuracy for `name` (`PaperFigures`)."""
    return get_model_card(name).paper


def _is_preset_path(name):
    """Whether `name`, not a registered name, is meant as a path: a path object, a separator, or a directory."""
    return (
        isinstance(name, os.PathLike)
        or isinstance(name, str)
        and (os.sep in name or "/" in name or os.path.isdir(name))
    )


def build_model(name, *, dtype=None, seed=None, load_weights=True, **overrides):
    """A model of the zoo, from a registered name or a preset directory: ``build_model("quadratic")``.

    A registered name comes first: to load a preset directory that has a
    registered name, give it as a path (``"./quadratic"``). A name is never
    read as a path unless it names an existing directory.

    Args:
        name: a name from `list_models()` (a new model with fresh weights; the
            name is its identity when saved, preset and exported), or a preset
            directory (`save_to_preset`, ``<run>/preset``): the saved model, as
            its own class, with its weights (`from_preset`).
        dtype: the dtype policy of every layer, as keras-hub's backbones take
            it: a name (``"float32"``, ``"mixed_float16"``, ``"mixed_bfloat16"``,
            ``"bfloat16"``, ...) or a `keras.DTypePolicy`; None is Keras' global
            policy for a name (``keras.config.dtype_policy()``, which is never
            changed) and the saved policy for a preset. The model's own
            ``dtype_policy`` is set too, so that ``compile`` wraps the
            optimizer in a `LossScaleOptimizer` for ``"mixed_float16"``.
        seed: int or None, for a name. When given, seeds Keras' global random
            state (``keras.utils.set_random_seed``) before building, so two
            builds with the same seed have the same weights.
        load_weights: for a preset: False gives its architecture with fresh weights.
        **overrides: for a name, any field of the model's config
            (``num_classes``, ``image_size``, ``num_layers``, ``hidden_dim``,
            ``class_names``, ``pixel_mean``, ...). A preset's architecture is
            its own but for its classes: ``num_classes`` (and ``class_names``)
            give its features a new classification head, to fine-tune on other
            classes (`ImageClassifier.with_config`).

    Returns:
        An uncompiled model of the family's class (`AttentionClassifier` or
        `ResNet`) from uint8 images ``(batch, image_size, image_size, 3)`` to
        float32 logits (the normalisation and the logits layer are float32
        under any `dtype`). Its ``get_config()`` is its configuration, so a
        ``.keras`` file of it reloads as the same class.

    Example:
    >>> model = build_model("quadratic_tiny", image_size=16, seed=0)
    >>> model.name, model.count_params()
    ('quadratic_tiny', 66544)
    """
    return _build(name, "name", dtype, seed, load_weights, overrides)


def _build(name, argument, dtype, seed, load_weights, overrides, model_class=ImageClassifier):
    """`build_model` for a caller whose user calls `name` `argument` (``"preset"`` for `from_preset`); a preset
    directory's model must be a `model_class` (default: any model of the package)."""
    if isinstance(name, str) and name in _REGISTRY or not _is_preset_path(name):
        # An unknown name: named, with the closest.
        get_model_card(name, or_else=" or a preset directory", argument=argument)
        if load_weights is not True:
            raise ValueError(
                f"`load_weights` is for a preset directory; {name!r} is a model name (its weights "
                f"are new). Received: load_weights={load_weights!r}"
            )
        # The one validation of the config: the model is built from it, not from its fields again.
        config = get_model_config(name, **overrides)
        dtype = dtype_policy(dtype)  # checked before the seed is set: a bad value changes nothing
        check_seed("seed", seed)
        if seed is not None:
            keras.utils.set_random_seed(seed)
        return config.build(name=name, dtype=dtype)
    head = {key: value for key, value in overrides.items() if key in HEAD_FIELDS}
    if len(head) < len(overrides) or seed is not None:
        given = {
            **{key: value for key, value in overrides.items() if key not in HEAD_FIELDS},
            **({"seed": seed} if seed is not None else {}),
        }
        raise ValueError(
            f"A preset's architecture and weights are its own: {str(name)!r} takes only `dtype`, "
            f"`load_weights`, and for a new classification head `num_classes` and `class_names`. "
            f"Received: {', '.join(f'{key}={value!r}' for key, value in given.items())}"
        )
    model = load_preset(name, dtype=dtype, load_weights=load_weights, model_class=model_class)
    return model.with_config(**head) if head else model


def from_preset(preset, *, dtype=None, load_weights=True, **head):
    """`build_model`'s alias: the model saved in the preset directory `preset` (or a registered name's new model).

    Args:
        preset: a preset directory (`save_to_preset`; ``attnconv train``
            writes the best model of a run to ``<run>/preset``), or a
            registered name. The package ships no trained weights: a name
            gives a new model with initial weights, as `build_model` does,
            with a warning saying so unless ``load_weights=False`` asks for
            just that (keras-hub's ``from_preset(name)`` would load trained
            weights).
        dtype: None (the policy it was saved with) or a dtype policy to
            rebuild it in (``"float32"``, ``"mixed_bfloat16"``, ...).
        load_weights: False gives the architecture with fresh weights.
        **head: ``num_classes`` and ``class_names``: the preset's features
            with a new classification head, to fine-tune on other classes
            (``from_preset("runs/quick/preset", num_classes=5)``; another
            number of classes gets a new ``logits`` layer, every other weight
            is the preset's: `ImageClassifier.with_config`).

    A preset is loaded in Keras' safe mode, its files checked against each
    other first (`keras_attnconv.models.presets.load_preset` says how).
    """
    return preset_model(preset, dtype, load_weights, head)


def preset_model(preset, dtype, load_weights, head, model_class=ImageClassifier):
    """`from_preset`'s model, for a call one frame above this one (its warning is the caller's caller's).

    A preset or registered name of a class other than `model_class` (`ImageClassifier.from_preset` of a
    family) is a ValueError naming both, raised before anything is built.
    """
    if isinstance(preset, str) and preset in _REGISTRY:
        check_preset_class(type(_REGISTRY[preset].config).model_class, model_class, preset)
        check_bool("load_weights", load_weights)
        if load_weights:
            warnings.warn(
                f"{preset!r} is a registered model name, and the package ships no trained weights: "
                f"from_preset({preset!r}) is a new model with initial weights, as build_model({preset!r}) is. "
                f"For trained weights, load a preset directory (`attnconv train` writes <run>/preset); for the "
                f"architecture alone, pass load_weights=False.",
                UserWarning,
                stacklevel=3,
            )
        return _build(preset, "preset", dtype, None, True, head)  # a name's model is new either way
    return _build(preset, "preset", dtype, None, load_weights, head, model_class)
