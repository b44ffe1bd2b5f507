"""`attnconv plot`: the figures of a training run or a preset, and the figures directory they are written into.

What is drawn, where it applies (`run_figures`):

- ``training_curves``: loss, accuracy and learning rate per epoch, from the run's ``history.csv``;
- ``centers_history`` (Figure 3): the centers during training, from the run's ``centers_history.npz``;
- ``attention_centers`` (Figure 4): each layer's centers and contours (quadratic and Gaussian heads);
- ``attention_maps_<i>`` (Figures 5, 6): every head's attention for a few query pixels of the validation
  image ``i`` of the model's dataset (any attention model, windowed ones with their window).

A preset made by `attnconv train` records its run (``training_run`` in its
metadata), whose history it is drawn with; a run still training is drawn from
its best checkpoint so far. What does not apply, or cannot be
drawn here (a ResNet's attention, images that would need a download), is
named with the reason in `RunFigures.absent`.

The figures directory (`write_figures`) is the package's when it was absent or
empty before the package wrote into it (then it carries the package's mark)
or when it is a run's own ``figures/`` (a directory in the run: a link there
to elsewhere is not the run's, and is judged as what it points to): there the
figures are rewritten. Any other directory is the user's: a figure is added to
it only under a name that is free (nothing there, not even a dangling link). A
directory the package marked as something else (a run, a preset, an export
root), or a folder inside one (an export root's model folder), takes no
figures at all.
"""

import dataclasses
import os
from pathlib import Path

from keras_attnconv.analysis.attention import layer_centers, load_centers_history
from keras_attnconv.analysis.curves import plot_training_curves
from keras_attnconv.analysis.viz import plot_attention_centers, plot_attention_maps, plot_centers_history
from keras_attnconv.layers.encoder import encoder_blocks
from keras_attnconv.utils.files import figure_paths, write_figure
from keras_attnconv.utils.ownership import ForeignDirectoryError, mark_of, visible_entries, what_it_holds, write_mark

#: Validation images drawn in the attention maps, and the number of query pixels drawn on each.
MAP_IMAGES = 2


@dataclasses.dataclass
class RunFigures:
    """The figures of a run or preset: ``figures`` ``{name: matplotlib Figure}`` and ``absent`` ``{name: why}``."""

    figures: dict
    absent: dict


def map_queries(height, width):
    """The query pixels of the attention maps: the grid's center and a pixel halfway to its top-left corner."""
    return [(height // 2, width // 2), (height // 4, width // 4)]


def _what_to_draw(source):
    """``(model, metadata, run)``: the model of `source`, what its dataset and recipe were, and its run (or None).

    A preset's model with its metadata, and the run it records (or `source` itself,
    when it is the run); a run still training (no preset yet) gives its best
    checkpoint so far, with its ``config.json`` as the recipe.
    """
    from keras_attnconv.models.presets import load_preset, load_preset_metadata
    from keras_attnconv.training.run_directory import RunDirectory, preset_of

    source_run = RunDirectory(source)
    try:
        preset = preset_of(source)
    except FileNotFoundError:
        if not (source_run.is_ours() and source_run.best_checkpoint.exists()):
            raise
        config = source_run.read_config() or {}
        return source_run.load_best_checkpoint(), {"dataset": config.get("dataset"), "recipe": config}, source_run
    metadata = load_preset_metadata(preset)
    run = source_run if source_run.is_ours() else None
    recorded = metadata.get("training_run")
    if run is None and isinstance(recorded, str) and RunDirectory(Path(preset) / recorded).is_ours():
        run = RunDirectory(Path(preset) / recorded)
    return load_preset(preset), metadata, run


def _history_figures(run, drawn, absent):
    from keras_attnconv.training.callbacks import csv_history

    if run is None:
        absent["training_curves"] = absent["centers_history"] = "the preset records no training run of its own"
        return
    history = csv_history(run.history)
    if history:
        drawn["training_curves"] = plot_training_curves(history, title=f"Training curves of {run.path.name}")
    else:
        absent["training_curves"] = f"{run.history} holds no epoch"
    centers = load_centers_history(run.centers_history)
    if centers:
        drawn["centers_history"] = plot_centers_history(
            centers, title=f"Attention centers of {run.path.name} during training (Figure 3)"
        )
    else:
        absent["centers_history"] = f"no {run.CENTERS} in {run.path} (recorded for quadratic and Gaussian heads)"


def _validation_images(metadata, model):
    """``(split, images, labels)`` of the first validation images of the model's dataset, or a reason string."""
    from keras_attnconv.training.data import dataset_info, load_arrays

    dataset = metadata.get("dataset") or "cifar10_sample"
    recipe = metadata.get("recipe") if isinstance(metadata.get("recipe"), dict) else {}
    try:
        split = recipe.get("eval_split") or dataset_info(dataset).eval_split
        images, labels = load_arrays(dataset, split, data_dir=recipe.get("data_dir"))  # never a download
    except Exception as error:  # noqa: BLE001 - any reason the images are not here is the reason the maps are not
        return f"the {dataset!r} images are not on this machine ({' '.join(str(error).split())[:200]})"
    if images.shape[1:] != tuple(model.input_shape[1:]):
        return f"the {dataset!r} images are {images.shape[1:]}, the model takes {tuple(model.input_shape[1:])}"
    count = min(MAP_IMAGES, len(images))
    return split, images[:count], labels[:count]


def _attention_figures(metadata, model, drawn, absent):
    from keras_attnconv.models import AttentionClassifier

    if not isinstance(model, AttentionClassifier):
        reason = f"{type(model).__name__} {model.name} has no attention heads"
        absent["attention_centers"] = absent["attention_maps"] = reason
        return
    try:
        layer_centers(model)
        drawn["attention_centers"] = plot_attention_centers(model)
    except ValueError as error:  # learned or content encodings: no centers
        absent["attention_centers"] = str(error)
    found = _validation_images(metadata, model)
    if isinstance(found, str):
        absent["attention_maps"] = found
        return
    split, images, labels = found
    height, width = encoder_blocks(model)[0].input.shape[1:3]
    names = getattr(model, "class_names", None)
    for index, (image, label) in enumerate(zip(images, labels)):
        label_name = names[label] if names is not None and label < len(names) else f"class {label}"
        drawn[f"attention_maps_{index}"] = plot_attention_maps(
            model,
            image,
            map_queries(height, width),
            title=f"{model.name}: attention of every head, {split} image {index} ({label_name}) (Figures 5, 6)",
        )


def run_figures(source):
    """The figures of a training run directory (finished or not) or a preset, from its best model, as `RunFigures`.

    A source with nothing to draw (a ResNet preset with no run) is a ValueError saying why.
    """
    model, metadata, run = _what_to_draw(source)
    drawn, absent = {}, {}
    _history_figures(run, drawn, absent)
    _attention_figures(metadata, model, drawn, absent)
    if not drawn:
        reasons = "; ".join(f"{name}: {why}" for name, why in absent.items())
        raise ValueError(
            f"Nothing to draw for {source}: its model {model.name} ({type(model).__name__}) gives no "
            f"figure: {reasons}. Received: source={str(source)!r}"
        )
    return RunFigures(drawn, absent)


def _is_a_runs_own_figures(directory):
    """Whether `directory` is the ``figures/`` of a run of the package, in the run itself (not a link to elsewhere)."""
    from keras_attnconv.training.run_directory import RunDirectory

    directory = Path(directory)
    return (
        directory.name == RunDirectory.FIGURES
        and not directory.is_symlink()
        and RunDirectory(directory.parent).is_ours()
    )


def _marked_ancestor(directory):
    """The nearest directory above where `directory` resolves that carries the package's mark, or None."""
    return next((parent for parent in Path(directory).resolve().parents if mark_of(parent) is not None), None)


def check_figures_directory(directory, argument="output"):
    """Raises `ForeignDirectoryError` (naming `argument`) if `directory` is, or is inside, another owner's directory.

    Another owner's: one the package marked as another kind, or a folder
    inside a directory the package marked (an export root's model folder, a
    run's ``logs/``), but for a run's own ``figures/``.
    """
    kind = mark_of(directory)
    if kind not in (None, "figures"):
        raise ForeignDirectoryError(
            f"{directory} is {what_it_holds(directory)}: figures go into a directory of "
            f"their own. Pass another {argument}. Received: {argument}={str(directory)!r}"
        )
    owner = None if _is_a_runs_own_figures(directory) else _marked_ancestor(directory)
    if owner is not None:
        raise ForeignDirectoryError(
            f"{directory} is inside {owner}, {what_it_holds(owner)}: figures go into a "
            f"directory of their own. Pass another {argument}. "
            f"Received: {argument}={str(directory)!r}"
        )


def write_figures(figures, directory, dpi=100, argument="output"):
    """Writes each ``{name: Figure}`` as ``<directory>/<name>.png`` and ``.svg``; returns the paths written.

    Nothing is written (and the error names the first file) when a file it
    would replace is not the package's: see the module's docstring.
    """
    directory = Path(directory)
    check_figures_directory(directory, argument)
    ours = mark_of(directory) == "figures" or _is_a_runs_own_figures(directory) or not visible_entries(directory)
    paths = {name: figure_paths(directory / name) for name in figures}
    if not ours:
        taken = [path for files in paths.values() for path in files if os.path.lexists(path)]  # a link too
        if taken:
            link = f" (a link to {directory.resolve()})" if directory.is_symlink() else ""
            raise FileExistsError(
                f"{taken[0]} exists in {directory}{link}, a directory the package did not make: it "
                f"is never replaced. Pass another {argument}. Received: {argument}={str(directory)!r}"
            )
    elif mark_of(directory) is None:
        write_mark(directory, "figures")
    return [path for name, figure in figures.items() for path in write_figure(figure, directory / name, dpi)]
