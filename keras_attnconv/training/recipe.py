"""Training recipes: the `TrainConfig` of one run, read from TOML and the command line.

Its checks use no framework (importing the package loads Keras, which registers
the package's classes), so `attnconv train` rejects a bad recipe or flag at once,
before any data, model or device is touched and before anything is written.
"""

import dataclasses
import numbers
import os
import tomllib
from pathlib import Path

from keras_attnconv.export.root import DEFAULT_EXPORT_DIRS, check_serving_name
from keras_attnconv.models.precision import check_precision
from keras_attnconv.models.step_compilation import check_jit_compile
from keras_attnconv.optim import SCHEDULES
from keras_attnconv.utils.checks import (
    check_bool,
    check_choice,
    check_known_fields,
    check_path,
    check_positive_int,
    check_real,
    check_seed,
    did_you_mean,
    none_word,
    plain_numbers,
)

# tf.distribute's on TensorFlow, Keras' distribution API's on JAX (`distribution.BACKEND_STRATEGIES`).
STRATEGIES = ("default", "mirrored", "multi_worker", "data_parallel")
# Which pixel statistics the model normalises with (`data.pixel_statistics`).
NORMALIZATIONS = ("official", "dataset")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training run; the defaults are Table 2 of the paper.

    Every field can be set in a recipe TOML file and on the command line
    (``--epochs 3``, ``--precision mixed_bfloat16``, ``--model-overrides
    '{num_layers = 2}'``). Every field is checked here, so a bad value fails
    before a run directory is created.

    Three fields say where the official code, which trained the paper's
    Table 1, and a plain recipe differ. The defaults are the plain choices;
    the paper recipes set the official ones: ``schedule`` ("official": the
    rate set once per epoch over ``epochs * (steps_per_epoch + 1)`` steps;
    "per_step"), ``normalization`` ("official": mean (0.4914, 0.4822,
    0.4465), std (0.2023, 0.1994, 0.2010) for every dataset; "dataset": the
    per-channel mean and std of its training split, `data.dataset_info`) and
    ``decay_centers_and_spreads`` (False: the attention
    centers and spreads get no weight decay, as in the official code).

    The warm-up lasts ``warmup_ratio`` of the run (Table 2: 5%, 15 of 300
    epochs), but at least ``min_warmup_epochs`` (at most half the run): a
    recipe shortened with ``--epochs`` keeps a warm-up the paper's models
    survive (`keras_attnconv.optim.run_schedule`).

    Three training choices go beyond the paper, all off by default and in
    the paper's recipes: ``label_smoothing`` (the loss'
    targets, `keras_attnconv.optim.LabelSmoothingCrossentropy`; 0: the
    paper's cross-entropy), ``ema_momentum`` (0: off; e.g. 0.999: the
    weights validated each epoch, kept as the best checkpoint, evaluated at
    the end and exported are an exponential moving average of the trained
    ones, Keras' ``use_ema``; training itself follows the raw weights) and
    ``cutout`` (0: off; e.g. 16: after the paper's crop and flip, a 16x16
    square of each training image is set to the mean pixel,
    `input_pipeline.cut_out_squares`). A fourth is the model's:
    ``model_overrides = {test_time_flips = true}``
    (`keras_attnconv.models.ClassifierConfig`), which every run measures both
    ways (``eval_accuracy_by_test_time_flips`` in ``metrics.json``).

    ``init_from`` fine-tunes a trained model instead of training new weights:
    a preset directory, or a finished run (its ``preset/``). The run's model
    is the preset's, with its architecture and its pixel statistics (which
    its features were trained on; ``normalization`` is not used), on the
    dataset's classes: another number of classes gets a new ``logits``
    layer (`keras_attnconv.models.ImageClassifier.with_config`). ``model``
    must be the preset's; ``model_overrides`` may change only what keeps
    every weight's shape (dropout, ``test_time_flips``, ...). The run records
    the preset's digest (``init_from_digest`` in its ``config.json``): a
    preset changed under an unfinished run is a changed configuration.
    """

    name: str = "run"
    model: str = "quadratic"
    model_overrides: dict = dataclasses.field(default_factory=dict)
    init_from: "str | None" = None
    dataset: str = "cifar10"
    data_dir: "str | None" = None
    download: bool = False
    eval_split: "str | None" = None
    epochs: int = 300
    batch_size: int = 100
    learning_rate: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    label_smoothing: float = 0.0
    ema_momentum: float = 0.0
    cutout: int = 0
    warmup_ratio: float = 0.05
    min_warmup_epochs: float = 6.0
    schedule: str = "per_step"
    decay_centers_and_spreads: bool = True
    normalization: str = "dataset"
    precision: str = "float32"
    jit_compile: "bool | str" = "auto"
    strategy: str = "default"
    seed: "int | None" = 0
    steps_per_epoch: "int | None" = None
    runs_dir: str = "runs"
    run_dir: "str | None" = None
    export_dir: "str | None" = DEFAULT_EXPORT_DIRS["saved_model"]
    export_name: "str | None" = None
    verbose: int = 1

    def __post_init__(self):
        for field in OPTIONAL_FIELDS:  # "none" in a recipe or on the command line: the value is omitted
            object.__setattr__(self, field, none_word(getattr(self, field)))
        for field in ("name", "model", "dataset", "runs_dir"):
            _check_text(field, getattr(self, field))
        for field in ("init_from", "data_dir", "eval_split", "run_dir", "export_dir"):  # the optional text fields
            if getattr(self, field) is not None:
                _check_text(field, getattr(self, field))
        for field in ("name", "init_from", "dataset", "data_dir", "runs_dir", "run_dir", "export_dir"):  # files
            if getattr(self, field) is not None:
                check_path(field, getattr(self, field))
        if self.export_name is not None:  # a directory of the export root: a plain name, never a path
            check_serving_name(self.export_name, "export_name")
        if "/" in self.name or self.name in (".", ".."):
            raise ValueError(
                f"`name` names a run directory under runs_dir and cannot be a path. Received: name={self.name!r}"
            )
        check_positive_int("epochs", self.epochs)
        check_positive_int("batch_size", self.batch_size)
        check_positive_int("steps_per_epoch", self.steps_per_epoch, allow_none=True)
        check_real("learning_rate", self.learning_rate, low=0.0, low_open=True)
        check_real("momentum", self.momentum, 0.0, 1.0, high_open=True)
        check_real("weight_decay", self.weight_decay, low=0.0)
        check_real("label_smoothing", self.label_smoothing, 0.0, 1.0, high_open=True)
        check_real("ema_momentum", self.ema_momentum, 0.0, 1.0, high_open=True)
        check_cutout(self.cutout)
        check_real("warmup_ratio", self.warmup_ratio, 0.0, 1.0, high_open=True)
        check_real("min_warmup_epochs", self.min_warmup_epochs, low=0.0)
        check_bool("download", self.download)
        check_jit_compile(self.jit_compile)
        check_precision(self.precision)
        check_choice("strategy", self.strategy, STRATEGIES)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("normalization", self.normalization, NORMALIZATIONS)
        check_bool("decay_centers_and_spreads", self.decay_centers_and_spreads)
        check_choice("verbose", self.verbose, (0, 1, 2))
        check_seed("seed", self.seed)
        plain_numbers(self)
        if not isinstance(self.model_overrides, dict):
            raise ValueError(
                "`model_overrides` must be a table/dict of the model's config fields: in a recipe "
                "`model_overrides = {num_layers = 2}`, on the command line --model-overrides '{num_layers = 2}'. "
                f"Received: model_overrides={self.model_overrides!r}"
            )

    @classmethod
    def from_dict(cls, values, source="recipe"):
        """Builds a config, rejecting unknown fields by name (with the closest valid one)."""
        check_known_fields(values, [f.name for f in dataclasses.fields(cls)], source)
        return cls(**values)


#: The fields whose value can be omitted (None; "none" in a recipe or on the command line).
OPTIONAL_FIELDS = (
    "init_from",
    "data_dir",
    "eval_split",
    "seed",
    "steps_per_epoch",
    "run_dir",
    "export_dir",
    "export_name",
)

# What each field is, in a line: `attnconv train --help` shows it beside the flag (a test keeps it whole).
FIELD_MEANINGS = {
    "name": "the run's name, its directory's under runs_dir (-1, -2, ... after finished runs)",
    "model": "a registered model (attnconv list)",
    "model_overrides": "fields of the model's config, a TOML table: '{num_layers = 2}'",
    "init_from": "a preset (or a finished run) whose trained model the run fine-tunes (none: new weights)",
    "dataset": "cifar10 or cifar100 (tensorflow-datasets), cifar10_sample (in the package), a .npz or an image folder",
    "data_dir": "where tensorflow-datasets keeps its data",
    "download": "let tensorflow-datasets download the dataset",
    "eval_split": "the split evaluated each epoch and at the end (none: test; validation for cifar10_sample)",
    "epochs": "epochs of training",
    "batch_size": "images per step, over all devices",
    "learning_rate": "SGD's rate after the warm-up",
    "momentum": "SGD's momentum",
    "weight_decay": "L2 weight decay, added to the gradient before momentum (the official code's)",
    "label_smoothing": "label smoothing of the loss' targets (0: none)",
    "ema_momentum": "momentum of an exponential moving average of the weights, validated and exported (0: none)",
    "cutout": "side of a square of each training image set to the mean pixel (0: none)",
    "warmup_ratio": "the linear warm-up's share of the run",
    "min_warmup_epochs": "the shortest warm-up, in epochs (at most half the run)",
    "schedule": "per_step, or official: the rate set once per epoch as in the official code",
    "decay_centers_and_spreads": "weight decay on the attention centers and spreads too (false: the official code's)",
    "normalization": "the pixel statistics: dataset (its training split's), or official (the official code's)",
    "precision": "float32, mixed_bfloat16 or mixed_float16",
    "jit_compile": "true (XLA), false, or auto: this device's path measured fastest",
    "strategy": "default, mirrored, multi_worker or data_parallel: how the run spreads over devices",
    "seed": "seed of the weights, the data's order, the augmentation and dropout (none: drawn)",
    "steps_per_epoch": "steps an epoch, cut from endless passes over the data (none: one pass)",
    "runs_dir": "the directory of the run directories",
    "run_dir": "the run directory itself (none: the next free one under runs_dir)",
    "export_dir": "where the trained model is exported for TF Serving (none: no export)",
    "export_name": "the name it is served under there (none: the model's own); one name serves one set of classes",
    "verbose": "Keras' progress output: 0, 1 or 2",
}


def check_cutout(cutout, image_size=None):
    """Raises ValueError naming `cutout` unless it is 0 (none) or a square's side, smaller than the images'
    (height, width) `image_size` where known: a recipe is checked without it, its batches with it
    (`input_pipeline.ArrayBatches`)."""
    bound = min(image_size) if image_size else float("inf")
    if isinstance(cutout, bool) or not isinstance(cutout, numbers.Integral) or not 0 <= cutout < bound:
        smaller = f" smaller than the images' {image_size[0]}x{image_size[1]}" if image_size else ""
        raise ValueError(
            "`cutout` must be 0 (none) or the side in pixels of the square cut out of each training image, "
            f"a positive integer{smaller}. Received: cutout={cutout!r}"
        )


def _check_text(name, value):
    if not isinstance(value, str) or not value:
        raise ValueError(f"`{name}` must be a non-empty string. Received: {name}={value!r}")


#: The paper's configurations, shipped with the package: ``attnconv train --recipe quadratic``.
RECIPES_DIR = Path(__file__).parent / "recipes"
PACKAGE_DIR = RECIPES_DIR.parent.parent


def recipe_names():
    """The names of the package's recipes (``quick``, ``quadratic``, ...), sorted."""
    return sorted(path.stem for path in RECIPES_DIR.glob("*.toml"))


def is_recipe_name(recipe):
    """Whether `recipe` is a name rather than a path: no directory part and no ``.toml`` ending."""
    text = str(recipe)
    return "/" not in text and os.sep not in text and not text.lower().endswith(".toml")


def recipe_path(recipe):
    """The TOML file of `recipe`: a package recipe's name (`recipe_names`) or a path to a file of the user's.

    A name has no directory part and no ``.toml`` ending (a file of the user's
    named like a recipe is given as ``./quadratic.toml``); an unknown name is
    an error that suggests the closest names. A relative path that is no file
    here but one of the package's recipes seen from the package
    (``training/recipes/quick.toml``) is that recipe.
    """
    check_path("recipe", recipe)
    if is_recipe_name(recipe):
        if str(recipe) not in recipe_names():
            raise FileNotFoundError(
                f"No recipe named {str(recipe)!r}.{did_you_mean(recipe, recipe_names())} The "
                f"package's recipes: {', '.join(recipe_names())} (`attnconv recipes`); a file of "
                f"yours is a path ending in .toml. Received: recipe={str(recipe)!r}"
            )
        return RECIPES_DIR / f"{recipe}.toml"
    path = Path(recipe)
    packaged = PACKAGE_DIR / path
    if not path.is_file() and not path.is_absolute() and packaged.is_file() and packaged.parent == RECIPES_DIR:
        # The package's own file as its source tree spells it (training/recipes/quick.toml), from any directory.
        return packaged
    if not path.is_file():
        raise FileNotFoundError(f"No recipe at {str(path)!r}. Received: recipe={str(path)!r}")
    return path


def load_recipe(recipe, **overrides):
    """A `TrainConfig` from a recipe (a package recipe's name, or a TOML file), with `overrides` applied.

    Every override given is applied, None (or "none") included: ``seed=None``
    is no seed, ``export_dir=None`` no export. A `model_overrides` table adds
    to the recipe's, unless `model` names another model. The run is named
    after the recipe (its ``name``, or its file's name) while the model is the
    recipe's own; with another model it is named after that model.
    """
    path = recipe_path(recipe)
    try:
        with path.open("rb") as f:
            values = {"name": path.stem, **tomllib.load(f)}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as error:
        # TOML is UTF-8 text; the parser recurses into nested values and arrays.
        reason = {UnicodeDecodeError: "it is not UTF-8 text", RecursionError: "it is nested too deeply"}.get(
            type(error), error
        )
        raise ValueError(
            f"The recipe {str(path)!r} is not valid TOML: {reason}. Received: recipe={str(path)!r}"
        ) from None
    same_model = overrides.get("model", values.get("model")) == values.get("model")
    if not same_model and isinstance(overrides["model"], str):  # another name: the check below names `model`
        values["name"] = overrides["model"]
    given, recipes = overrides.get("model_overrides"), values.get("model_overrides")
    if same_model and isinstance(given, dict) and isinstance(recipes, dict):
        # A table given on the command line adds to the recipe's, key by key, as TOML tables merge; for
        # another model it replaces it (the recipe's fields are its own model's).
        overrides["model_overrides"] = {**recipes, **given}
    values.update(overrides)
    return TrainConfig.from_dict(values, source=f"recipe ({path})")


def recipe_rows():
    """One row per package recipe for `attnconv recipes`: name, model, dataset, epochs and the paper's row."""
    from keras_attnconv.models import get_paper_figures

    rows = []
    for name in recipe_names():
        config = load_recipe(name)
        paper = get_paper_figures(config.model)
        rows.append(
            {
                "recipe": name,
                "model": config.model,
                "dataset": config.dataset,
                "epochs": config.epochs,
                "paper": f"{paper.row} ({paper.source})" if paper.row else "-",
            }
        )
    return rows
