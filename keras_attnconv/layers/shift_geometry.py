"""The grid of pixel shifts ``delta = k - q`` that position scores and attention spans are functions of.

Pixels are indexed row-major (``p = i * width + j``). Scores are built from
per-axis tables of shape (H, H) and (W, W) and combined here, so nothing of
size ``(H*W)^2`` is stored as a constant.
"""

import numpy as np
from keras import ops


def axis_shifts(length):
    """Key index minus query index along one axis: ``shifts[q, k] = k - q``, float32 (length, length)."""
    positions = np.arange(length, dtype="float32")
    return positions[None, :] - positions[:, None]


def pixel_shifts(height, width):
    """Row and column shifts of every (query, key) pixel pair: two int arrays (H*W, H*W)."""
    rows, cols = np.divmod(np.arange(height * width), width)
    return rows[None, :] - rows[:, None], cols[None, :] - cols[:, None]


def shift_grid(height, width):
    """Every shift of the grid: row and column shifts, float32 (2H-1, 2W-1) each, index ``shift + size - 1``."""
    rows = np.arange(-(height - 1), height, dtype="float32")
    cols = np.arange(-(width - 1), width, dtype="float32")
    return np.meshgrid(rows, cols, indexing="ij")


def centred_shifts(centers, height, width):
    """Row and column shifts minus each head's centre: (heads, H, H) and (heads, W, W)."""
    centers = ops.convert_to_tensor(centers)
    return (axis_shifts(height)[None] - centers[:, 0, None, None],
            axis_shifts(width)[None] - centers[:, 1, None, None])


def combine_axis_scores(row_scores, column_scores):
    """Sums per-axis scores into scores over pixel pairs.

    Args:
        row_scores: tensor (heads, H, H) indexed by (query row, key row).
        column_scores: tensor (heads, W, W) indexed by (query col, key col).

    Returns:
        Tensor (heads, H*W, H*W) with
        ``out[h, i*W + j, k*W + l] = row_scores[h, i, k] + column_scores[h, j, l]``.
    """
    heads, height = ops.shape(row_scores)[0], ops.shape(row_scores)[1]
    width = ops.shape(column_scores)[1]
    total = row_scores[:, :, None, :, None] + column_scores[:, None, :, None, :]
    return ops.reshape(total, (heads, height * width, height * width))


def combine_axis_features(row_features, column_features):
    """(H, H, D) and (W, W, D) per-axis features -> (H*W, H*W, D) summed features."""
    height, width = row_features.shape[0], column_features.shape[0]
    total = row_features[:, None, :, None, :] + column_features[None, :, None, :, :]
    return ops.reshape(total, (height * width, height * width, total.shape[-1]))
