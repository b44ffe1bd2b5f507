"""Figures of where attention heads look (the paper's Figures 3-6, 10, 12, 14).

Every ``plot_*`` function returns a matplotlib Figure and neither shows nor
saves it (`keras_attnconv.training.figures` makes those of a training run). The
numbers drawn come from `keras_attnconv.analysis.attention`. Heads are told
apart by marker and line style as well as colour (`analysis.style`), so the
figures read in greyscale; shifts and positions are in pixels of the attention
grid (the image after the model's 2x2 downsampling).
"""

import numpy as np

from keras_attnconv.analysis.attention import attention_probabilities, layer_centers
from keras_attnconv.analysis.style import SEQUENTIAL_CMAP, series_style
from keras_attnconv.layers.encoder import encoder_blocks

#: A contour whose 50% radius exceeds this many times the panel's half-width is not drawn.
_WIDEST_CONTOUR = 4
_UNIFORM = 1e300  # the variance of a head with alpha = 0 (infinite), finite for the eigendecomposition
#: Radius (in standard deviations) of the circle holding probability p of a 2-D Gaussian.
_CONTOURS = {0.5: np.sqrt(-2 * np.log(0.5)), 0.9: np.sqrt(-2 * np.log(0.1))}
_CONTOUR_STYLES = {0.5: "-", 0.9: ":"}
COLUMN_SHIFT_LABEL = "column shift (pixels)"
ROW_SHIFT_LABEL = "row shift (pixels)"


def _pyplot():
    import matplotlib.pyplot as plt

    return plt


def _legend_columns(width, entries):
    return max(1, min(entries, int(width // 1.7)))  # entries of about 1.7 inches fit side by side


def _grid(count, columns, legend_entries, size=2.8):
    """A constrained-layout figure of `count` panels in rows of `columns`, the unused cells hidden, with room
    below for a legend of `legend_entries` entries (`_legend_below`) and above for the title."""
    rows = -(-count // columns)
    width = max(size * columns, 5.6)
    legend_rows = -(-legend_entries // _legend_columns(width, legend_entries))
    figure, axes = _pyplot().subplots(
        rows, columns, figsize=(width, size * rows + 0.7 + 0.25 * legend_rows), squeeze=False, layout="constrained"
    )
    for axis in axes.flat[count:]:
        axis.set_visible(False)
    return figure, axes.flat[:count]


def _layer_title(index, name):
    return f"layer {index + 1} ({name})"


def _head_handle(head):
    """The legend entry of a head: its colour, marker and line style."""
    from matplotlib.lines import Line2D

    return Line2D([], [], **series_style(head), markersize=5, label=f"head {head + 1}")


def _query_handle():
    from matplotlib.lines import Line2D

    return Line2D([], [], linestyle="none", marker="s", color="black", markersize=6, label="query pixel")


def _shift_axes(axis, limit):
    """A panel of shifts from the query: x the column shift, y the row shift growing downwards, as in an image."""
    axis.set_xlim(-limit, limit)
    axis.set_ylim(limit, -limit)
    axis.set_aspect("equal")
    axis.set_xlabel(COLUMN_SHIFT_LABEL)
    axis.set_ylabel(ROW_SHIFT_LABEL)
    axis.grid(True, linewidth=0.3, alpha=0.5)


def _legend_below(figure, handles):
    figure.legend(
        handles=handles,
        loc="outside lower center",
        ncols=_legend_columns(figure.get_figwidth(), len(handles)),
        fontsize="small",
        frameon=False,
    )


def plot_attention_centers(model, extent=None, columns=3):
    """Each head's center relative to the query pixel, with the contours holding 50% and 90% of its attention.

    One panel per encoder block; circles for quadratic heads, ellipses for
    Gaussian heads (Figures 4, 12 and 14). Each panel's lines are the heads'
    centers (one point each, in head order); its patches are each head's 50%
    (solid) and 90% (dotted) contours, then the query pixel (black square).
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Ellipse, Rectangle

    centers = layer_centers(model)
    heads = max(len(means) for means, _ in centers.values())
    figure, axes = _grid(len(centers), min(columns, len(centers)), heads + len(_CONTOUR_STYLES) + 1)
    for index, (axis, (name, (means, covariances))) in enumerate(zip(axes, centers.items())):
        limit = extent or max(4.0, float(np.abs(means).max()) + 2)
        too_wide = 0
        for head, (mean, covariance) in enumerate(zip(means, covariances)):
            style = series_style(head)
            # x = column shift, y = row shift (rows grow downwards, as in an image).
            axis.plot(mean[1], mean[0], linestyle="none", marker=style["marker"], color=style["color"], markersize=5)
            eigenvalues, eigenvectors = np.linalg.eigh(np.nan_to_num(covariance, posinf=_UNIFORM))
            radii = np.sqrt(np.maximum(eigenvalues[::-1], 0))
            if _CONTOURS[0.5] * radii.max() > _WIDEST_CONTOUR * limit:
                # A head whose alpha trained to about 0 attends nearly uniformly; its contours (a dashed line
                # millions of pixels long) would cover the panel and take minutes to render.
                too_wide += 1
                continue
            angle = np.degrees(np.arctan2(eigenvectors[0, 1], eigenvectors[1, 1]))
            for probability, linestyle in _CONTOUR_STYLES.items():
                width, height = 2 * _CONTOURS[probability] * radii
                axis.add_patch(
                    Ellipse(
                        (mean[1], mean[0]),
                        width,
                        height,
                        angle=angle,
                        fill=False,
                        linestyle=linestyle,
                        color=style["color"],
                    )
                )
        axis.add_patch(Rectangle((-0.5, -0.5), 1, 1, color="black"))
        _shift_axes(axis, limit)
        note = f"\n{too_wide} nearly uniform head{'s' * (too_wide > 1)}: no contour" if too_wide else ""
        axis.set_title(_layer_title(index, name) + note)
    contours = [
        Line2D([], [], color="black", linestyle=linestyle, label=f"{probability:.0%} of the attention")
        for probability, linestyle in _CONTOUR_STYLES.items()
    ]
    _legend_below(figure, [_head_handle(head) for head in range(heads)] + contours + [_query_handle()])
    figure.suptitle(f"{model.name}: attention centers of each head (Figure 4)")
    return figure


def _is_index(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _as_queries(queries, height, width):
    """`queries` (one (row, column) pair or a sequence of them) as a list of int pairs on the grid, checked."""
    error = ValueError(
        f"`queries` must be a (row, column) pair, or a sequence of them, on the {height}x{width} "
        f"attention grid. Received: queries={queries!r}"
    )
    try:
        one = len(queries) == 2 and all(_is_index(value) for value in queries)
        pairs = [tuple(queries)] if one else [tuple(pair) for pair in queries]
    except TypeError:
        raise error from None
    if not pairs or not all(
        len(pair) == 2 and all(map(_is_index, pair)) and 0 <= pair[0] < height and 0 <= pair[1] < width
        for pair in pairs
    ):
        raise error
    return [(int(row), int(column)) for row, column in pairs]


def _mark_query(axis, row, column, scale=1.0):
    """The query pixel as a black-and-white outline: visible on any colour, and in greyscale."""
    from matplotlib.patches import Rectangle

    corner = (column * scale - 0.5, row * scale - 0.5)
    for color, linewidth in (("black", 2.4), ("white", 1.0)):
        axis.add_patch(Rectangle(corner, scale, scale, fill=False, edgecolor=color, linewidth=linewidth))


def _mark_window(axis, block, row, column, height, width):
    """The keys a windowed block lets the query see: the rectangle around its window (dashed), if it has one."""
    from matplotlib.patches import Rectangle

    neighbourhood = block.attention.neighbourhood(height, width)
    if neighbourhood is None:
        return False
    rows, columns = np.divmod(neighbourhood.key_indices[row * width + column], width)
    axis.add_patch(
        Rectangle(
            (columns.min() - 0.5, rows.min() - 0.5),
            np.ptp(columns) + 1,
            np.ptp(rows) + 1,
            fill=False,
            edgecolor="white",
            linestyle="--",
            linewidth=1.2,
        )
    )
    return True


def plot_attention_maps(model, image, queries, title=None):
    """Attention of every head of every layer for a few query pixels of one image (Figures 5, 6, 10).

    One row per (query, layer), one column per head, after a first column
    showing the image with the query; the head panels share one colour scale,
    whose bar is on the right. A windowed block's maps are on the whole grid
    (0 outside the window) with the query's window drawn dashed. Each head
    panel's label (``axis.get_label()``) is ``"attention: layer L, head H,
    query (r, c)"``; the image panels' ``"image: query (r, c)"``.

    Args:
        model: a model of encoder blocks.
        image: one uint8 image (H, W, 3), the raw pixels, as the model takes it.
        queries: a (row, column) of the query token on the attention grid, or a sequence of them.
        title: the figure's title (default: the model's name and the figures it reproduces).
    """
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    blocks = encoder_blocks(model)
    height, width = blocks[0].input.shape[1:3]
    queries = _as_queries(queries, height, width)
    image = np.asarray(image)
    probabilities = attention_probabilities(model, image)  # checks the image
    heads = max(p.shape[0] for p in probabilities)
    maps = {
        (q, layer): p[:, row * width + column].reshape(-1, height, width)
        for q, (row, column) in enumerate(queries)
        for layer, p in enumerate(probabilities)
    }
    norm = Normalize(0.0, max(float(m.max()) for m in maps.values()))
    rows = len(queries) * len(probabilities)
    figure, axes = _pyplot().subplots(
        rows, heads + 1, figsize=(1.35 * (heads + 1) + 1.2, 1.35 * rows + 1.3), squeeze=False, layout="constrained"
    )
    scale = image.shape[0] / height
    windowed = False
    mappable = None
    for (q, layer), layer_maps in maps.items():
        row, column = queries[q]
        axes_row = axes[q * len(probabilities) + layer]
        for axis in axes_row:
            axis.set_xticks([])
            axis.set_yticks([])
        if layer == 0:
            axes_row[0].imshow(image)
            _mark_query(axes_row[0], row, column, scale)
            axes_row[0].set_title(f"query ({row}, {column})", fontsize="small")
            axes_row[0].set_label(f"image: query ({row}, {column})")
        else:
            axes_row[0].set_visible(False)
        for head, axis in enumerate(axes_row[1:]):
            if head >= len(layer_maps):  # a pruned layer has fewer heads
                axis.set_visible(False)
                continue
            mappable = axis.imshow(layer_maps[head], cmap=SEQUENTIAL_CMAP, norm=norm)
            _mark_query(axis, row, column)
            windowed |= _mark_window(axis, blocks[layer], row, column, height, width)
            axis.set_label(f"attention: layer {layer + 1}, head {head + 1}, query ({row}, {column})")
            if q == 0 and layer == 0:
                axis.set_title(f"head {head + 1}", fontsize="small")
        axes_row[1].set_ylabel(f"layer {layer + 1}", fontsize="small")
    colorbar = figure.colorbar(mappable, ax=axes[:, 1:].ravel().tolist(), shrink=0.8)
    colorbar.set_label("attention probability")
    handles = [Patch(facecolor="white", edgecolor="black", linewidth=2, label="query pixel")]
    if windowed:
        handles.append(Line2D([], [], color="grey", linestyle="--", label="the query's window"))
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize="small", frameon=False)
    figure.suptitle(title or f"{model.name}: attention probabilities of every head (Figures 5, 6)")
    return figure


def plot_centers_history(history, columns=3, title="Attention centers during training (Figure 3)"):
    """Trajectories of the centers during training, one panel per block (Figure 3).

    Each head's lines are, in order: its trajectory (one point per recorded
    epoch), its start (hollow marker) and its end (filled marker); the last
    line of a panel is the query pixel.

    Args:
        history: ``analysis.AttentionCentersHistory.history`` (or the same dict loaded back).
    """
    from matplotlib.lines import Line2D

    if not history:
        raise ValueError(f"`history` must hold the centers of at least one layer. Received: history={history!r}")
    heads = max(np.shape(epochs)[1] for epochs in history.values())
    figure, axes = _grid(len(history), min(columns, len(history)), heads + 3)  # heads, start, end, query
    for index, (axis, (name, epochs)) in enumerate(zip(axes, history.items())):
        path = np.asarray(epochs)  # (epochs, heads, 2)
        for head in range(path.shape[1]):
            style = series_style(head)
            color, marker = style["color"], style["marker"]
            axis.plot(path[:, head, 1], path[:, head, 0], color=color, linestyle=style["linestyle"], linewidth=1)
            axis.plot(
                path[0, head, 1],
                path[0, head, 0],
                marker=marker,
                color=color,
                fillstyle="none",
                linestyle="none",
                markersize=5,
            )
            axis.plot(path[-1, head, 1], path[-1, head, 0], marker=marker, color=color, linestyle="none", markersize=5)
        axis.plot(0, 0, "s", color="black", markersize=6)
        _shift_axes(axis, max(4.0, float(np.abs(path).max()) + 1))
        # After a few epochs the moves are a fraction of a pixel: the title says how far, the panel where.
        moved = float(np.linalg.norm(path[-1] - path[0], axis=-1).max(initial=0.0))
        axis.set_title(
            f"{_layer_title(index, name)}, {path.shape[0] - 1} epochs\nlargest move {moved:.2g} pixels",
            fontsize="medium",
        )
    ends = [
        Line2D([], [], color="grey", marker="o", fillstyle=fill, linestyle="none", label=label)
        for fill, label in (("none", "start"), ("full", "end"))
    ]
    _legend_below(figure, [_head_handle(head) for head in range(heads)] + ends + [_query_handle()])
    figure.suptitle(title)
    return figure
