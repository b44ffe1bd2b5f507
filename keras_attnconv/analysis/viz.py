"""Figures of where attention heads look (the paper's Figures 3-5, 10, 12, 14).

Every ``plot_*`` function returns a matplotlib Figure and neither shows nor
saves it (`keras_attnconv.training.figures` makes those of a training run). The
numbers drawn come from `keras_attnconv.analysis.attention`.
"""

import numpy as np

from keras_attnconv.analysis.attention import attention_probabilities, layer_centers
from keras_attnconv.layers.encoder import encoder_blocks

#: Radius (in standard deviations) of the circle holding probability p of a 2-D Gaussian.
_CONTOURS = {0.5: np.sqrt(-2 * np.log(0.5)), 0.9: np.sqrt(-2 * np.log(0.1))}


def _pyplot():
    import matplotlib.pyplot as plt

    return plt


def _grid(count, columns, size=2.6):
    plt = _pyplot()
    rows = -(-count // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(size * columns, size * rows), squeeze=False)
    for axis in axes.flat[count:]:
        axis.set_visible(False)
    return figure, axes.flat[:count]


def plot_attention_centers(model, extent=None, columns=3):
    """Each head's center relative to the query pixel, with 50% (solid) and 90% (dotted) contours.

    One panel per encoder block; circles for quadratic heads, ellipses for
    Gaussian heads (Figures 4, 12 and 14). The query pixel is the black square.
    """
    from matplotlib.patches import Ellipse, Rectangle

    centers = layer_centers(model)
    figure, axes = _grid(len(centers), min(columns, len(centers)))
    colors = _pyplot().get_cmap("tab20").colors
    for axis, (name, (means, covariances)) in zip(axes, centers.items()):
        for head, (mean, covariance) in enumerate(zip(means, covariances)):
            color = colors[head % len(colors)]
            # x = column shift, y = row shift (rows grow downwards, as in an image).
            axis.plot(mean[1], mean[0], "o", color=color, markersize=4)
            eigenvalues, eigenvectors = np.linalg.eigh(np.nan_to_num(covariance, posinf=1e6))
            angle = np.degrees(np.arctan2(eigenvectors[0, 1], eigenvectors[1, 1]))
            for probability, style in ((0.5, "-"), (0.9, ":")):
                width, height = 2 * _CONTOURS[probability] * np.sqrt(np.maximum(eigenvalues[::-1], 0))
                axis.add_patch(Ellipse((mean[1], mean[0]), width, height, angle=angle, fill=False,
                                       linestyle=style, color=color))
        axis.add_patch(Rectangle((-0.5, -0.5), 1, 1, color="black"))
        limit = extent or max(4.0, float(np.abs(means).max()) + 2)
        axis.set_xlim(-limit, limit)
        axis.set_ylim(limit, -limit)
        axis.set_aspect("equal")
        axis.set_title(name)
    figure.tight_layout()
    return figure


def plot_attention_maps(model, image, query):
    """Attention of every head of every layer for one query pixel, over the image (Figures 5, 10).

    Args:
        model: a model of encoder blocks.
        image: one uint8 image (H, W, 3), the raw pixels, as the model takes it.
        query: (row, column) of the query token on the attention grid.
    """
    plt = _pyplot()
    probabilities = attention_probabilities(model, image)
    height, width = encoder_blocks(model)[0].input.shape[1:3]
    row, column = query
    if not (0 <= row < height and 0 <= column < width):
        raise ValueError(f"`query` must lie on the {height}x{width} attention grid. Received: query={query}")
    heads = max(p.shape[0] for p in probabilities)
    figure, axes = plt.subplots(len(probabilities), heads, figsize=(1.4 * heads, 1.4 * len(probabilities)),
                                squeeze=False)
    for layer, layer_probabilities in enumerate(probabilities):
        for head in range(heads):
            axis = axes[layer, head]
            axis.set_xticks([])
            axis.set_yticks([])
            if head >= layer_probabilities.shape[0]:
                axis.set_visible(False)
                continue
            attention = layer_probabilities[head, row * width + column].reshape(height, width)
            axis.imshow(attention, cmap="viridis")
            axis.add_patch(plt.Rectangle((column - 0.5, row - 0.5), 1, 1, fill=False, color="black"))
        axes[layer, 0].set_ylabel(f"layer {layer + 1}")
    figure.tight_layout()
    return figure


def plot_centers_history(history, columns=3):
    """Trajectories of the centers during training, one panel per block (Figure 3).

    Args:
        history: ``analysis.AttentionCentersHistory.history`` (or the same dict loaded back).
    """
    figure, axes = _grid(len(history), min(columns, len(history)))
    colors = _pyplot().get_cmap("tab20").colors
    for axis, (name, epochs) in zip(axes, history.items()):
        path = np.asarray(epochs)  # (epochs, heads, 2)
        for head in range(path.shape[1]):
            color = colors[head % len(colors)]
            axis.plot(path[:, head, 1], path[:, head, 0], "-", color=color, linewidth=1)
            axis.plot(path[-1, head, 1], path[-1, head, 0], "o", color=color, markersize=4)
        axis.plot(0, 0, "s", color="black")
        axis.invert_yaxis()
        axis.set_aspect("equal")
        axis.set_title(f"{name} ({path.shape[0] - 1} epochs)")
    figure.tight_layout()
    return figure


