"""The numerics suite of `attnconv bench --suite numerics`: mixed precision on the device, checked.

Three checks, each in float32, mixed_bfloat16 and mixed_float16:

- training: a recipe (default: the quick one, a tiny model on the embedded
  real CIFAR-10 sample) trained for the same epochs in each precision; the
  loss history must be finite and each mixed precision's accuracy within 2
  points of float32's (the report names the data and the digest of the file
  read);
- far centers: quadratic heads centered far outside the grid with
  ``alpha = 1e4``: a training step of a one-layer model gives a finite loss
  and finite weights, on the separable and on the dense path;
- large grids: the attention layer at 32x32 and 64x64 tokens at batch 8, the
  separable path against the general one (same weights and input): the
  largest difference relative to the outputs' scale, within the compute
  dtype's tolerance (float32 matmuls may run as TF32 on a GPU).

On a GPU these are the figures issue 18 asks for; on a CPU `--quick` runs
them at tiny shapes (what the tests do).
"""

import os
import tempfile
from pathlib import Path

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers import RelativeMultiHeadAttention
from keras_attnconv.models.precision import PRECISIONS
from keras_attnconv.training.callbacks import csv_history
from keras_attnconv.training.run_directory import RunDirectory
from keras_attnconv.utils.assets import SAMPLE_PATH
from keras_attnconv.utils.console import retracing_warnings_off
from keras_attnconv.utils.files import file_digest
from keras_attnconv.utils.reports import device_description, device_text, json_settings, write_report

NUMERICS_FULL = {
    "recipe": "quick",
    "epochs": None,
    "sizes": (32, 64),
    "batch": 8,
    "hidden": 400,
    "heads": 9,
    "alpha": 1e4,
    "accuracy_points": 2.0,
}
NUMERICS_QUICK = {
    "recipe": "quick",
    "epochs": 1,
    "sizes": (4, 6),
    "batch": 2,
    "hidden": 8,
    "heads": 4,
    "alpha": 1e4,
    "accuracy_points": 100.0,
    "model_overrides": {"num_layers": 1, "hidden_dim": 8, "intermediate_dim": 8},
    "image_size": 8,
}
# Largest |separable - general| / max |general| accepted per compute dtype: a few units in the last place of
# the dtype's mantissa (TF32's 10 bits for float32 on a GPU), accumulated over the keys.
RELATIVE_TOLERANCE = {"float32": 2e-3, "bfloat16": 3e-2, "float16": 5e-3}


def _measured(value):
    """A figure for the report: the float when finite, else its name ("nan", "inf", "-inf").

    JSON has no NaN or infinity, and a non-finite figure is what a failed check shows: written as text,
    the report keeps it instead of the whole suite failing at the end.
    """
    value = float(value)
    return value if np.isfinite(value) else str(value)


def _shown(value, spec):
    """A figure of the report in the markdown: formatted when a number, its name when not finite."""
    return format(value, spec) if isinstance(value, float) else value


def training_data(recipe, run_dir, image_size=None, **_):
    """(dataset, record) of the training check: the recipe's dataset, or for `--quick` the embedded sample's
    center crops, and what the report says of it: its name, and the file read with its digest (None for data
    that is not one file: a TFDS name, an image folder)."""
    from keras_attnconv.training.recipe import load_recipe

    if image_size:
        dataset = _cropped_sample(run_dir, image_size)
        name = f"cifar10_sample: the {image_size}x{image_size} center crops of its first 200 images"
    else:
        dataset = name = load_recipe(_recipe_path(recipe)).dataset
    path = SAMPLE_PATH if dataset == "cifar10_sample" else Path(str(dataset)).expanduser()
    if not path.is_file():
        return dataset, {"name": str(name), "file": None, "digest": None}
    return dataset, {"name": str(name), "file": path.name, "digest": file_digest(path)}


def training_agreement(recipe, epochs, run_dir, accuracy_points, dataset, model_overrides=None, **_):
    """The recipe trained on `dataset` in each precision: accuracy, finite losses, distance to float32 in points."""
    from keras_attnconv.training.fit import train
    from keras_attnconv.training.recipe import load_recipe

    rows = []
    for precision in PRECISIONS:
        # What is None here is not an override: the recipe's own epochs and model.
        given = {"epochs": epochs, "model_overrides": model_overrides, "dataset": dataset}
        config = load_recipe(
            _recipe_path(recipe),
            precision=precision,
            run_dir=os.path.join(run_dir, precision),
            verbose=0,
            **{k: v for k, v in given.items() if v is not None},
        )
        metrics = train(config)
        rows.append(
            {
                "precision": precision,
                "eval_accuracy": metrics["eval_accuracy"],
                "finite": bool(np.isfinite(_losses(config.run_dir)).all()),
                "epochs": config.epochs,
            }
        )
    reference = rows[0]["eval_accuracy"]
    for row in rows:
        row["points_from_float32"] = 100 * (row["eval_accuracy"] - reference)
        row["ok"] = row["finite"] and abs(row["points_from_float32"]) <= accuracy_points
    return rows


def _recipe_path(recipe):
    """`recipe` as given, or else relative to the repository holding this package (the committed recipes)."""
    repository_recipe = Path(__file__).resolve().parents[2] / recipe
    return recipe if Path(recipe).exists() or not repository_recipe.exists() else repository_recipe


def _losses(run_dir):
    """Every loss column of the run's ``history.csv``."""
    history = csv_history(RunDirectory(run_dir).history)
    return np.array([values for name, values in history.items() if "loss" in name], dtype="float64")


def _cropped_sample(run_dir, size):
    """The embedded sample's center crops of ``size x size`` as a `.npz` dataset (tiny shapes for `--quick`)."""
    from keras_attnconv.training.data import load_arrays

    x, y = load_arrays("cifar10_sample", "train")
    start = (x.shape[1] - size) // 2
    crop = x[:200, start : start + size, start : start + size]
    path = os.path.join(run_dir, f"sample_{size}.npz")
    os.makedirs(run_dir, exist_ok=True)
    np.savez(path, x_train=crop[:160], y_train=y[:160], x_test=crop[160:], y_test=y[160:200])
    return path


# The paths of a position-only layer: separable, general, and the tiled windowed path (whose nearest window key is
# not the nearest key for a far center).
FAR_CENTER_PATHS = ({"separable": True}, {"separable": False}, {"window": 3, "windowed": True})


def far_centers(alpha, **_):
    """A training step of one quadratic layer with far centers and huge alpha, per precision and path."""
    rows = []
    for precision in PRECISIONS:
        for path_options in FAR_CENTER_PATHS:
            keras.utils.set_random_seed(0)
            inputs = keras.Input((6, 5, 4))
            layer = RelativeMultiHeadAttention(4, dtype=precision, **path_options)
            model = keras.Model(inputs, layer(inputs))
            model.dtype_policy = keras.DTypePolicy(precision)
            layer.position_score.centers.assign(
                np.array([[0.3, -0.7], [40.0, -55.0], [-1e3, 2e3], [2.0, 1.0]], "float32")
            )
            layer.position_score.set_alpha(np.full(4, alpha, "float32"))
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=True)
            x = np.random.default_rng(0).normal(size=(2, 6, 5, 4)).astype("float32")
            loss = model.train_on_batch(x, np.zeros_like(x))
            finite = bool(np.isfinite(loss)) and all(np.isfinite(ops.convert_to_numpy(w)).all() for w in model.weights)
            rows.append({"precision": precision, "path": layer.attention_mode, "loss": _measured(loss), "ok": finite})
    return rows


def large_grids(sizes, batch, hidden, heads, **_):
    """Separable vs general path of the attention layer at ``size x size`` tokens, per precision."""
    rows = []
    for size in sizes:
        x = np.random.default_rng(0).normal(size=(batch, size, size, hidden)).astype("float32")
        for precision in PRECISIONS:
            fast, general = (
                RelativeMultiHeadAttention(heads, separable=separable, dtype=precision) for separable in (True, False)
            )
            fast.build(x.shape)
            general.build(x.shape)
            general.set_weights(fast.get_weights())
            fast_y, general_y = (ops.convert_to_numpy(ops.cast(layer(x), "float32")) for layer in (fast, general))
            scale = float(np.abs(general_y).max())
            relative = float(np.abs(fast_y - general_y).max() / scale)
            tolerance = RELATIVE_TOLERANCE[keras.DTypePolicy(precision).compute_dtype]
            rows.append(
                {
                    "tokens": f"{size}x{size}",
                    "batch": batch,
                    "precision": precision,
                    "relative_difference": _measured(relative),
                    "tolerance": tolerance,
                    "ok": bool(np.isfinite(fast_y).all()) and relative <= tolerance,
                }
            )
            del fast, general
    return rows


def run_numerics(quick=False, output="numerics.json", run_dir=None, command=None, **overrides):
    """Runs the three checks; writes JSON and a markdown summary beside it; returns the results.

    The training runs go to `run_dir` (default: a fresh temporary directory, so that a rerun trains
    again instead of resuming the previous run).
    """
    run_dir = run_dir or tempfile.mkdtemp(prefix="attnconv-numerics-")
    settings = {**(NUMERICS_QUICK if quick else NUMERICS_FULL), **overrides}
    dataset, data = training_data(**settings, run_dir=run_dir)
    with retracing_warnings_off():  # a model per precision and path: each traces its own step
        results = {
            "command": command,
            "device": device_description(),
            # A non-finite setting (alpha = inf) by its name too: JSON has none, and the figures must be written.
            "settings": json_settings({k: _measured(v) if isinstance(v, float) else v for k, v in settings.items()}),
            "data": data,
            "large_grids": large_grids(**settings),
            "far_centers": far_centers(**settings),
            "training": training_agreement(**settings, dataset=dataset, run_dir=run_dir),
        }
    results["ok"] = all(row["ok"] for part in ("large_grids", "far_centers", "training") for row in results[part])
    write_report(output, results, numerics_markdown(results))
    return results


def _data_text(data):
    """The training check's data in the markdown: its name, and the file read with its digest where it is one."""
    if data["file"] is None:
        return f"{data['name']} (not one file: no digest)"
    return f"{data['name']}, read from `{data['file']}` ({data['digest']})"


def numerics_markdown(results):
    device, settings = results["device"], results["settings"]
    lines = [f"Device: {device_text(device)}; backend {device['backend']}, Keras {device['keras']}.", ""]
    if results.get("command"):
        lines += [f"Command: `{results['command']}`", ""]
    lines += [
        f"Training (`{settings['recipe']}`), accuracy within {settings['accuracy_points']:g} points of "
        "float32, finite losses:",
        "",
        f"Data: {_data_text(results['data'])}.",
        "",
        "| precision | accuracy | points from float32 | finite | ok |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['precision']} | {100 * r['eval_accuracy']:.1f}% | {r['points_from_float32']:+.1f} "
        f"| {r['finite']} | {r['ok']} |"
        for r in results["training"]
    ]
    lines += [
        "",
        f"Far centers (up to 2,000 pixels away), alpha = {_shown(settings['alpha'], 'g')}, one training step:",
        "",
        "| precision | path | loss | finite |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['precision']} | {r['path']} | {_shown(r['loss'], '.4g')} | {r['ok']} |" for r in results["far_centers"]
    ]
    lines += [
        "",
        f"Attention layer ({settings['heads']} heads, hidden {settings['hidden']}), separable vs general path:",
        "",
        "| tokens | batch | precision | max relative difference | tolerance | ok |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['tokens']} | {r['batch']} | {r['precision']} | {_shown(r['relative_difference'], '.1e')} "
        f"| {r['tolerance']:.0e} | {r['ok']} |"
        for r in results["large_grids"]
    ]
    lines += ["", f"All checks passed: {results['ok']}."]
    return "\n".join(lines) + "\n"
