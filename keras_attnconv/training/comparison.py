"""`attnconv compare`: train several models with one recipe on the same data and tabulate the results.

Every model is trained by `keras_attnconv.training.train` with the recipe's
values (same data, seed, schedule and epochs), only ``model`` changing; each
run has its own run directory (``runs/compare-<model>``), so an interrupted
comparison resumes where it stopped when run again: a finished model's run is
read, not trained again.
"""

import dataclasses

from keras_attnconv.models import get_model_card, get_paper_figures
from keras_attnconv.utils.files import check_writable
from keras_attnconv.utils.reports import device_description, device_text, percent, report_paths, write_report

#: One small model per position encoding of the zoo, for the quick recipe on a CPU.
ENCODINGS = (
    "quadratic_tiny",
    "gaussian_tiny",
    "learned_tiny",
    "learned_content_tiny",
    "siren_tiny",
    "quadratic_span_tiny",
    "learned_span_tiny",
    "absolute_learned_tiny",
    "absolute_sinusoid_tiny",
    "learned_content_local_tiny",
    "absolute_learned_local_tiny",
    "quadratic_span_local_tiny",
)


def compare_models(recipe, models=ENCODINGS, output="compare.json", **overrides):
    """Trains each of `models` with `recipe` (and `overrides`), writes JSON + markdown, returns the results.

    Everything (the names, each model's configuration with the recipe's data,
    the output) is checked before the first model trains. A model whose run
    with the same settings has finished (a comparison run again after a
    crash) is not trained again: its run's metrics are taken.
    """
    from keras_attnconv.training.fit import train
    from keras_attnconv.training.plan import check_run
    from keras_attnconv.training.recipe import load_recipe
    from keras_attnconv.training.runs import finished_run

    if isinstance(models, str) or not models or not all(isinstance(name, str) and name for name in models):
        raise ValueError(f"`models` must name at least one model. Received: models={models!r}")
    for name in models:
        get_model_card(name, argument="models")  # unknown names fail here, before any training
    for path in report_paths(output):
        check_writable(path, "output", file=True)
    recipe_values = load_recipe(recipe, **overrides)
    configs = {
        name: dataclasses.replace(recipe_values, model=name, name=f"compare-{name}", export_dir=None) for name in models
    }
    first, *others = models
    plan = check_run(configs[first], models=others)  # the data once, then each model's configuration
    rows = []
    for name, config in configs.items():
        finished = finished_run(config)
        if finished is not None:
            metrics = finished.finished_metrics()
        else:
            metrics = train(config)
        rows.append(
            {
                "model": name,
                "description": _encoding(name),
                "trainable_parameters": metrics["trainable_parameters"],
                "eval_accuracy": metrics["eval_accuracy"],
                # The same evaluation set for every model; a run finished before it was recorded has the plan's.
                "eval_examples": metrics.get("eval_examples", len(plan.eval_batches.labels)),
                "best_val_accuracy": metrics["best_val_accuracy"],
                "train_images_per_second": metrics["train_images_per_second"],
                "wall_seconds": metrics["wall_seconds_this_session"],
                "run_dir": metrics["run_dir"],
            }
        )
    results = {
        "recipe": str(recipe),
        "epochs": recipe_values.epochs,
        "dataset": recipe_values.dataset,
        "seed": recipe_values.seed,
        "precision": recipe_values.precision,
        "eval_split": metrics["eval_split"],
        # The device the images per second and the wall times were measured on: a CPU's model and its bfloat16
        # and vector units, or the GPU's name.
        "machine": device_description(),
        "rows": rows,
    }
    write_report(output, results, markdown_table(results))
    return results


def _encoding(name):
    """What a model stands for: a small variant is described by its full-size configuration."""
    full = name.removesuffix("_tiny")
    try:
        return get_paper_figures(full).row + (" (small variant)" if full != name else "")
    except ValueError:
        return get_paper_figures(name).row


def markdown_table(results):
    """The comparison as a markdown table, best final accuracy first."""
    lines = [
        f"Recipe `{results['recipe']}` ({results['dataset']}, {results['epochs']} "
        f"epoch{'' if results['epochs'] == 1 else 's'}, "
        f"{results['precision']}, seed {results['seed']}), accuracy on the {results['eval_split']} split; "
        f"{_device_line(results['machine'])}, Keras {results['machine']['keras']} on "
        f"{results['machine']['backend']}.",
        "",
        "| model | encoding | params | final accuracy | best epoch's accuracy | train images/s | wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in sorted(results["rows"], key=lambda r: -r["eval_accuracy"]):
        lines.append(
            f"| `{row['model']}` | {row['description']} | {row['trainable_parameters'] / 1e3:.0f}k "
            f"| {percent(row['eval_accuracy'])} | {percent(row['best_val_accuracy'])} "
            f"| {_rate(row['train_images_per_second'])} | {row['wall_seconds'] / 60:.1f} min |"
        )
    return "\n".join(lines + _twins_table(results["rows"])) + "\n"


def _device_line(machine):
    """What the speeds were measured on; a file written before the device was recorded has the CPU count alone."""
    return device_text(machine) if "device" in machine else f"{machine['cpus']} CPUs"


def _twins_table(rows):
    """Each local model (``<name>_local...``) beside its global twin (the same name without ``_local``), if both ran."""
    by_model = {row["model"]: row for row in rows}
    twins = {row["model"]: row["model"].replace("_local", "") for row in rows if "_local" in row["model"]}
    pairs = [(by_model[local], by_model[twin]) for local, twin in twins.items() if twin in by_model]
    if not pairs:
        return []
    lines = [
        "",
        "Each local model beside its global twin (the same model without a window), same recipe and seed:",
        "",
        "| model | accuracy | train images/s | global twin | twin's accuracy | twin's train images/s |",
        "|---|---|---|---|---|---|",
    ]
    for local, twin in pairs:
        lines.append(
            f"| `{local['model']}` | {percent(local['eval_accuracy'])} "
            f"| {_rate(local['train_images_per_second'])} | `{twin['model']}` "
            f"| {percent(twin['eval_accuracy'])} | {_rate(twin['train_images_per_second'])} |"
        )
    return lines


# A figure a finished run lacks (None: no validation, or images/s of a run finished by an earlier version after its
# last epoch) is a dash: the table of a comparison never fails on a finished run's metrics.
def _rate(value):
    return "-" if value is None else f"{value:.0f}"
