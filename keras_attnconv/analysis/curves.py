"""Training curves: loss, accuracy and learning rate per epoch, from a run's history (``history.csv``'s columns).

`plot_training_curves` returns a matplotlib Figure; it neither shows nor saves it.
"""

from keras_attnconv.analysis.style import series_style

#: (panel, y label, the history's columns drawn in it and their legend labels), in the order of the panels.
PANELS = (
    ("loss", "cross-entropy loss", (("loss", "training"), ("val_loss", "validation"))),
    ("accuracy", "accuracy", (("accuracy", "training"), ("val_accuracy", "validation"))),
    ("learning rate", "learning rate (end of epoch)", (("learning_rate", "learning rate"),)),
)


def plot_training_curves(history, title="Training curves"):
    """One panel per quantity the history holds (loss, accuracy, learning rate), against the epoch (from 1).

    Args:
        history: ``{column: [value per epoch]}``, e.g. `keras.callbacks.History.history` or the columns of
            a run's ``history.csv`` (``training.callbacks.csv_history``). A panel whose columns are all
            absent is left out; a history with none of them is a ValueError.
    """
    import matplotlib.pyplot as plt

    if not isinstance(history, dict):
        raise ValueError(
            f"`history` must be a dict of columns (name -> values per epoch). Received: history={history!r}"
        )
    panels = [
        (name, label, [(column, legend) for column, legend in series if history.get(column)])
        for name, label, series in PANELS
    ]
    panels = [panel for panel in panels if panel[2]]
    if not panels:
        raise ValueError(
            f"`history` holds none of the columns drawn ({', '.join(c for *_, s in PANELS for c, _ in s)}"
            f"). Received: history columns {sorted(history)}"
        )
    figure, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.3), squeeze=False, layout="constrained")
    for axis, (name, label, series) in zip(axes[0], panels):
        for index, (column, legend) in enumerate(series):
            values = history[column]
            axis.plot(range(1, len(values) + 1), values, **series_style(index), markersize=4, label=legend)
        axis.set_xlabel("epoch")
        axis.set_ylabel(label)
        axis.set_title(name)
        axis.grid(True, linewidth=0.3, alpha=0.5)
        axis.xaxis.get_major_locator().set_params(integer=True)
        if name == "learning rate":
            axis.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        else:
            axis.legend(fontsize="small")
    figure.suptitle(title)
    return figure
