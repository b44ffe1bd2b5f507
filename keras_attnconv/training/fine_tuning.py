"""Fine-tuning: a run that starts from a trained model, a preset's (``init_from``), instead of new weights.

The run's model is the preset's: its architecture and its pixel statistics,
which its features were trained on, on the classes of the run's dataset. It
is built by the run like any other model (seeded, in the run's precision and
strategy) and then given the preset's weights, but a new classification head
for another number of classes (`ImageClassifier.with_config`'s rule, which
timm's and keras-hub's ``num_classes`` of a pretrained model follow too). A
resumed run takes every weight from its backup instead.
"""

from keras_attnconv.training.run_directory import preset_of


def init_from_preset(init_from):
    """The preset directory that `init_from` names (a preset, or a finished run's ``preset/``).

    Raises FileNotFoundError naming `init_from` where it is neither.
    """
    try:
        return preset_of(init_from)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"`init_from` must be a preset directory (config.json, model.weights.h5, metadata.json) or a finished "
            f"training run (with preset/) to start from. Received: init_from={str(init_from)!r}"
        ) from None


def init_from_digest(init_from):
    """The digest of the preset that `init_from` names (`preset_digest`), or None where it names none.

    A run records it: the same command with the preset changed is another run.
    """
    from keras_attnconv.models.presets import preset_digest

    try:
        return preset_digest(init_from_preset(init_from))
    except FileNotFoundError:  # the run's plan says so, naming the field
        return None


def starting_model(config, info):
    """The preset's model of `config.init_from`, in the run's precision, and the run's model config.

    Returns ``(preset_model, model_config)``: the trained model as the preset
    holds it, whose weights the run starts from (`start_from`), and its config
    on the dataset's classes (`DatasetInfo` `info`) with the recipe's
    ``model_overrides``. Raises, naming the field and the value received,
    where `config.init_from` names no preset or a damaged one, where
    `config.model` is not the preset's model, and where the dataset or the
    overrides would change any weight's shape but the head's (its images'
    size, for a model whose weights depend on it; a layer's width).
    """
    from keras_attnconv.models.image_classifier import copy_weights
    from keras_attnconv.models.presets import load_preset

    preset = init_from_preset(config.init_from)
    try:
        model = load_preset(preset, dtype=config.precision)
    except (FileNotFoundError, ValueError) as error:
        raise ValueError(f"The preset of `init_from` cannot be loaded: {error}") from None
    if model.name != config.model:
        raise ValueError(
            f"`init_from` holds a {model.name} model, and a fine-tuning run trains the preset's model: pass "
            f"--model {model.name} (or the recipe that trained it). Received: model={config.model!r}, "
            f"init_from={config.init_from!r}"
        )
    changes = {
        "num_classes": info.num_classes,
        "class_names": info.class_names,
        "image_size": info.image_size,
        **config.model_overrides,
    }
    # Built once to check that every weight but the head's keeps its shape; the run builds its own.
    changed = type(model).from_config({**model.get_config(), **changes})
    try:
        copy_weights(model, changed, new_head=True)
    except ValueError as error:
        reason = str(error).rstrip(".")  # Keras' own sentence
        raise ValueError(
            f"A fine-tuning run keeps the preset's weights, so its dataset ({config.dataset}: "
            f"{info.image_size}x{info.image_size} images, {info.num_classes} classes) and `model_overrides` can "
            f"change only the classes and what has no weights: {reason}. Received: init_from={config.init_from!r}, "
            f"model_overrides={config.model_overrides!r}"
        ) from None
    return model, changed.config


def start_from(model, preset_model):
    """Sets the run's new `model` to the preset's weights, but a new head for another number of classes."""
    from keras_attnconv.models.image_classifier import copy_weights

    new_head = model.config.num_classes != preset_model.config.num_classes
    copy_weights(preset_model, model, new_head=new_head)
