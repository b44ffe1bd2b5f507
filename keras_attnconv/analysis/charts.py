"""Charts of measured tables: a comparison of models (`attnconv compare`) and the benchmarks' speed-ups
(`attnconv bench`). Each ``plot_*`` takes the results dict its command writes as JSON and returns a matplotlib
Figure; series differ by marker, line style and hatching as well as colour (`analysis.style`).
"""

import math

from keras_attnconv.analysis.style import COLORS, series_style

#: Bar fills told apart in greyscale.
HATCHES = ("", "//", "..", "xx", "\\\\", "oo")


def accuracy_standard_error(accuracy, examples):
    """The standard error of an accuracy measured on `examples` images: sqrt(p (1 - p) / n) (binomial)."""
    if not examples:
        return float("nan")
    return math.sqrt(accuracy * (1 - accuracy) / examples)


def precision_label(row):
    """A benchmark row's training precision, and ", no loss scaling" where its mixed_float16 step ran without it."""
    return row["precision"] if row.get("loss_scaling", True) else f"{row['precision']}, no loss scaling"


def _rows_of(results, argument):
    rows = results.get("rows") if isinstance(results, dict) else None
    if not rows:
        raise ValueError(
            f"`{argument}` must be a results dict with at least one row. Received: {argument}="
            f"{type(results).__name__} with {len(rows) if rows else 'no'} rows"
        )
    return rows


def plot_comparison(results):
    """Accuracy (with the standard error of its evaluation set, as error bars) and training images per second.

    Two panels of horizontal bars, one bar per model, the most accurate at the
    top; `results` is what `training.comparison.compare_models` returns (each
    row's ``eval_examples`` gives the error bar; a row without it has none).
    """
    import matplotlib.pyplot as plt

    rows = sorted(_rows_of(results, "results"), key=lambda row: row["eval_accuracy"])
    names = [row["model"] for row in rows]
    accuracy = [100 * row["eval_accuracy"] for row in rows]
    errors = [100 * accuracy_standard_error(row["eval_accuracy"], row.get("eval_examples")) for row in rows]
    rates = [row["train_images_per_second"] or 0.0 for row in rows]
    figure, (left, right) = plt.subplots(1, 2, figsize=(9.5, 1.2 + 0.38 * len(rows)), sharey=True, layout="constrained")
    positions = range(len(rows))
    left.barh(
        positions,
        accuracy,
        xerr=[0 if math.isnan(e) else e for e in errors],
        color=COLORS[0],
        edgecolor="black",
        hatch=HATCHES[1],
        capsize=3,
        error_kw={"elinewidth": 1},
    )
    left.set_yticks(list(positions), names)
    left.set_xlabel(f"accuracy on the {results.get('eval_split', 'evaluation')} split (%), ± 1 standard error")
    left.set_title("accuracy")
    right.barh(positions, rates, color=COLORS[1], edgecolor="black", hatch=HATCHES[2])
    right.set_xlabel("training images per second")
    right.set_title("speed")
    for axis in (left, right):
        axis.grid(True, axis="x", linewidth=0.3, alpha=0.5)
    machine = results.get("machine", {})
    figure.suptitle(
        f"Recipe {results.get('recipe')}: {results.get('dataset')}, {results.get('epochs')} epochs, "
        f"{machine.get('cpus', '?')} CPUs ({machine.get('backend', '?')})"
    )
    return figure


def _token_count(tokens):
    """The number of tokens of a grid written ``"16x16"`` (or already a number)."""
    return math.prod(int(side) for side in str(tokens).split("x"))


def plot_speedups(results):
    """The CPU benchmark's speed-ups: each attention comparison against the number of tokens, and each model's
    training step against ResNet's of the same precision and path (`bench.run_benchmark`'s results)."""
    import matplotlib.pyplot as plt

    comparisons = results["settings"]["comparisons"]

    def setting(row):  # results written before the step paths were measured have no "path": XLA's
        return row["precision"], row.get("path", "xla")

    resnet = {setting(row): row["step_ms"] for row in results["models"] if row["model"].startswith("resnet")}
    models = [row for row in results["models"] if setting(row) in resnet and not row["model"].startswith("resnet")]
    figure, axes = plt.subplots(1, 2, figsize=(11, max(3.6, 1.2 + 0.35 * len(models))), layout="constrained")
    for index, name in enumerate(comparisons):
        rows = sorted(
            (row for row in results["layer"] if row["comparison"] == name), key=lambda row: _token_count(row["tokens"])
        )
        axes[0].plot(
            [_token_count(row["tokens"]) for row in rows],
            [row["speedup"] for row in rows],
            **series_style(index),
            label=f"{name}: {rows[0]['fast_mode']} vs {rows[0].get('baseline_mode', 'baseline')}",
        )
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("tokens (attention grid pixels)")
    axes[0].set_ylabel("speed-up of the fast path (x)")
    axes[0].set_title("attention layer, forward + backward")
    axes[0].legend(fontsize="small")
    labels = [f"{row['model']} ({', '.join(setting(row))})" for row in models]
    ratios = [row["step_ms"] / resnet[setting(row)] for row in models]
    bars = axes[1].barh(
        range(len(models)), ratios, color=[COLORS[i % len(COLORS)] for i in range(len(models))], edgecolor="black"
    )
    for index, bar in enumerate(bars):
        bar.set_hatch(HATCHES[index % len(HATCHES)])
    axes[1].set_yticks(range(len(models)), labels, fontsize="small")
    axes[1].invert_yaxis()  # the table's order, top to bottom
    axes[1].axvline(1.0, color="black", linewidth=0.8)
    axes[1].set_xlabel("training step time / ResNet's (x)")
    axes[1].set_title("training step against ResNet")
    for axis in axes:
        axis.grid(True, linewidth=0.3, alpha=0.5)
    machine = results.get("machine", {})
    cpu_model = machine.get("cpu", {}).get("model") or machine.get("processor", "?")
    figure.suptitle(f"CPU benchmark: {cpu_model}, {machine.get('cpus', '?')} CPUs")
    return figure


def plot_gpu_steps(results):
    """The GPU benchmark's training step time of each model in each precision, and the speed-up of each precision
    over float32 (`bench.run_gpu_benchmark`'s results)."""
    import matplotlib.pyplot as plt

    rows = _rows_of(results, "results")
    models = list(dict.fromkeys(f"{row['model']} ({row['path'] or '-'})" for row in rows))
    precisions = list(dict.fromkeys(precision_label(row) for row in rows))
    step = {(f"{row['model']} ({row['path'] or '-'})", precision_label(row)): row["step_ms"] for row in rows}
    figure, axes = plt.subplots(
        1, 2, figsize=(11, 1.5 + 0.45 * len(models) * len(precisions) / 2), layout="constrained", sharey=True
    )
    height = 0.8 / len(precisions)
    for index, precision in enumerate(precisions):
        positions = [m + index * height for m in range(len(models))]
        times = [step.get((model, precision), 0.0) for model in models]
        float32 = [step.get((model, "float32")) for model in models]
        style = {
            "color": COLORS[index % len(COLORS)],
            "edgecolor": "black",
            "hatch": HATCHES[index % len(HATCHES)],
            "height": height,
            "label": precision,
        }
        axes[0].barh(positions, times, **style)
        axes[1].barh(positions, [f / t if f and t else 0.0 for f, t in zip(float32, times)], **style)
    axes[0].set_yticks([m + 0.4 - height / 2 for m in range(len(models))], models, fontsize="small")
    axes[0].set_xlabel("training step (ms, median)")
    axes[1].set_xlabel("speed-up over float32 (x)")
    axes[1].axvline(1.0, color="black", linewidth=0.8)
    axes[0].legend(fontsize="small")
    for axis in axes:
        axis.grid(True, axis="x", linewidth=0.3, alpha=0.5)
    figure.suptitle(f"GPU benchmark: {results['device']['device']}, batch {results['settings']['batch']}")
    return figure
