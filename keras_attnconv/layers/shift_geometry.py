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


def centered_shifts(centers, height, width):
    """Row and column shifts minus each head's center: (heads, H, H) and (heads, W, W)."""
    centers = ops.convert_to_tensor(centers)
    # ops.subtract, not `-`: a NumPy table less a PyTorch tensor is a TypeError (torch takes no ndarray operand).
    return (
        ops.subtract(axis_shifts(height)[None], centers[:, 0, None, None]),
        ops.subtract(axis_shifts(width)[None], centers[:, 1, None, None]),
    )


def squares_from_nearest(shifts, window_keys=None):
    """``shifts**2`` less each row's least square, an exact 0 at the row's shift nearest 0 however it is rounded.

    ``shifts[..., q, k] = k - q - c``, the keys ``k = 0, 1, ...`` of one axis less a query ``q``
    and a center ``c`` (`centered_shifts`). Written as ``(s - s*) (s + s*)``, ``s*`` the row's
    entry at the key nearest ``q + c``: the first factor is an exact 0 at that key (and so is its
    derivative), and so is the second at a key as near on the other side (a center between two
    pixels). ``s**2 - s***2`` would be, for far centers, the difference of two numbers of ~1e6
    that XLA may round otherwise in each kernel it recomputes them in.

    Args:
        shifts: (..., L, L) float.
        window_keys: None (every key), or int NumPy (L, K): the keys of each query's window, in
            increasing order with a constant step (`AxisTiling.keys`). ``s*`` is then the entry
            at the window key nearest ``q + c``, so that the least square over the window is the
            exact 0: for a far center and a huge weight every other score in the window may
            be -inf, which would leave the window no finite score.
    """
    length = shifts.shape[-1]
    if window_keys is None:
        window_keys = np.broadcast_to(np.arange(length), (length, length))
    first, count = window_keys[:, :1].astype("float32"), window_keys.shape[1]
    step = (window_keys[:, -1:] - window_keys[:, :1]).astype("float32") / max(count - 1, 1)
    step = np.where(step > 0, step, 1.0).astype("float32")
    # As tensors: PyTorch takes no NumPy operand in an arithmetic operator.
    first, step = ops.convert_to_tensor(first, shifts.dtype), ops.convert_to_tensor(step, shifts.dtype)
    # The key nearest q + c, from the row's first entry (-q - c) rounded onto the window's keys: no argmin, whose
    # TensorFlow kernel's sign test of -0.0 uses a bitwise AND that LiteRT's builtin ops lack. Its entry is taken by
    # a one-hot sum, whose other terms are exact zeros, rather than a gather. Without a window: first 0 and step 1.
    slot = ops.clip(ops.round((-shifts[..., :1] - first) / step), 0, count - 1)
    nearest_key = first + step * slot
    picked = ops.arange(length, dtype=shifts.dtype) == nearest_key
    nearest = ops.sum(ops.where(picked, shifts, 0.0), axis=-1, keepdims=True)
    return (shifts - nearest) * (shifts + nearest)


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


def take_per_pair(per_shift, index):
    """``per_shift[b, n, i, h, index[n, i, r]]``: values per shift read at every tile pair's shift.

    Args:
        per_shift: (batch, tiles, Bq, heads, shifts), values of each query for each shift.
        index: int NumPy array (tiles, Bq, Rk), the shift (in ``[0, shifts)``) of every tile pair.

    Returns:
        (batch, tiles, Bq, heads, Rk), in `per_shift`'s dtype.

    One gather of (batch, heads) rows from `per_shift` laid out as (tiles, Bq, shifts, batch,
    heads), with a (tiles, Bq, Rk) index. `ops.take_along_axis` would be the same function, but
    on TensorFlow it broadcasts the index to the whole output in int64 (8 bytes per score) and
    took 2.5-3x as long forward + backward (16x16 and 32x32 tokens, 7x7 window).
    """
    _, tiles, queries, heads, shifts = per_shift.shape  # static; the batch may not be
    keys = index.shape[-1]
    rows = (np.arange(tiles * queries).reshape(tiles, queries, 1) * shifts + index).astype("int32")
    table = ops.reshape(ops.transpose(per_shift, (1, 2, 4, 0, 3)), (tiles * queries * shifts, -1))
    picked = ops.reshape(ops.take(table, rows, axis=0), (tiles, queries, keys, -1, heads))
    return ops.transpose(picked, (3, 0, 1, 4, 2))


def pair_scores_from_axis_shifts(per_shift, height, width, query_major=False):
    """Scores of every (query, key) pair from each query's scores per row shift and per column shift.

    Args:
        per_shift: (batch, H*W, heads, (2H-1) + (2W-1)): query ``q``'s score for each row shift
            (index ``delta_1 + H - 1``) and then each column shift (index ``2H - 1 + delta_2 + W - 1``).
        query_major: bool, lay the result out (batch, query, head, key) instead.

    Returns:
        float32 (batch, heads, H*W, H*W), ``out[b, h, q, k] = per_shift[b, q, h, row(q, k)] +
        per_shift[b, q, h, column(q, k)]`` at the row and column shifts of the pair; with
        `query_major`, (batch, H*W, heads, H*W) indexed ``[b, q, h, k]``.

    The queries of image row ``i`` read the row shifts ``-i .. H-1-i`` of their keys' rows, a
    slice of ``H`` entries starting at ``H - 1 - i``; those of column ``j`` a slice of ``W``
    column shifts: static slices (their gradient: pads), not a gather, whose scatter-add gradient
    XLA runs as a loop on a CPU. Only these small (batch, heads, T, H) and (batch, heads, T, W)
    parts are re-laid out (query-major: none); the pairs are their sum (`sum_row_and_column_scores`).
    """
    batch, heads = ops.shape(per_shift)[0], per_shift.shape[2]
    grid = ops.reshape(per_shift, (batch, height, width, heads, per_shift.shape[-1]))
    rows = ops.stack([grid[:, i, :, :, height - 1 - i : 2 * height - 1 - i] for i in range(height)], axis=1)
    first_column = 2 * height - 1 + width - 1  # the column shift 0
    columns = ops.stack([grid[:, :, j, :, first_column - j : first_column - j + width] for j in range(width)], axis=2)
    if query_major:  # rows (batch, H, W, heads, H) and columns (..., W): the heads stay between query and key
        return ops.reshape(_outer_sum(rows, columns), (batch, height * width, heads, height * width))
    return sum_row_and_column_scores(ops.transpose(rows, (0, 3, 1, 2, 4)), ops.transpose(columns, (0, 3, 1, 2, 4)))


def sum_row_and_column_scores(row_scores, column_scores):
    """Per-query row and column scores summed over the pixel pairs, in float32.

    Args:
        row_scores: (..., H, W, H), indexed by (query row, query column, key row).
        column_scores: (..., H, W, W), indexed by (query row, query column, key column).

    Returns:
        float32 (..., H*W, H*W), ``out[..., i*W + j, k*W + l] = row_scores[..., i, j, k] +
        column_scores[..., i, j, l]``.
    """
    height, width = column_scores.shape[-3], column_scores.shape[-1]
    total = _outer_sum(row_scores, column_scores)
    return ops.reshape(total, (*ops.shape(total)[:-4], height * width, height * width))


def _outer_sum(row_scores, column_scores):
    """``row_scores[..., k] + column_scores[..., l]`` over every (k, l), in float32: (..., H, W)."""
    return ops.cast(row_scores, "float32")[..., :, None] + ops.cast(column_scores, "float32")[..., None, :]
