"""Neighbourhood (local) attention geometry: which keys each query sees, as static NumPy index tables.

The rule is NATTEN's (Hassani et al., "Neighborhood Attention Transformer"):
along an axis of length ``L`` with window ``K`` (odd) and dilation ``d``,

- the axis is split into ``d`` interleaved groups by ``index mod d``;
- within its group a query's window is the ``K`` group members centered on it,
  shifted (not cropped) to stay inside the group, so every query has exactly
  ``K`` keys and is itself one of them;
- relative positions stay the true shifts ``key - query``.

In 2-D the window is the product of a row window and a column window, so a
query has ``Kh * Kw`` keys. A window longer than the axis (``d = 1``) is
clipped to the axis: every position is then a key, as in global attention.
With ``d > 1`` NATTEN requires ``K * d <= L`` (every group holds a window).

The attention is computed in tiles (see `windowed_attention`): the queries of
a tile are ``B`` consecutive members of one group per axis, and their windows
lie inside a region of ``B + K - 1`` group members (consecutive windows start
at most one member apart). A tile's scores are (tile queries x region keys)
with the keys outside each query's window masked, so the attention costs
``O(T (B + K - 1)^2)`` per channel and head instead of ``O(T^2)``, and no
(query, key) table of the whole map is ever built. Tables here are NumPy
(int32 / bool), computed once per grid and cached.
"""

import dataclasses
import functools
import math

import numpy as np

from keras_attnconv.layers.validation import check_tensor_bytes

# Cost of a tile row, in units of one (query, key) score, of gathering and scattering its key region
# (`_choose_block`): with it, small blocks pay for the region they duplicate. With 3, K = 7 on 16 pixels
# takes B = 4 (0.39 of the global pairs), measured 1.06-1.08x faster than global content attention
# (9 heads, hidden 400, batch 2, 2-core CPU) where one tile of the whole axis (B = 16) was 0.86-0.90x.
_REGION_COST = 3


def window_starts(length, window, dilation=1, half=None):
    """First key of every position's window along one axis (NATTEN's rule), int array (length,).

    Args:
        length, window, dilation: the axis, its window (keys per query) and dilation; every group
            of positions (``index mod dilation``) must hold ``window`` members.
        half: keys before the query in an unclamped window; ``window // 2`` unless the window was
            clipped to a short axis (then the clipped window starts at 0 anyway).
    """
    half = window // 2 if half is None else half
    index = np.arange(length)
    group, position = index % dilation, index // dilation
    group_length = (length - group + dilation - 1) // dilation
    return group + dilation * np.clip(position - half, 0, group_length - window)


@dataclasses.dataclass(frozen=True)
class AxisTiling:
    """One axis cut into tiles of ``block`` queries, each with the region of keys their windows cover.

    Attributes:
        keys: (length, window) every position's window keys, in increasing order.
        queries: (tiles, block) positions of each tile's queries; a short last tile of a group
            repeats its last query (those copies are never read back).
        regions: (tiles, region) positions of each tile's keys; a region shorter than the
            longest repeats its first key, masked for every query.
        mask: (tiles, block, region) bool, whether region key r is in the window of query i.
        query_tile, query_slot: (length,) where each position sits as a query.
        key_slots: (length, window) the region slot of each of its window keys.
    """

    keys: np.ndarray
    queries: np.ndarray
    regions: np.ndarray
    mask: np.ndarray
    query_tile: np.ndarray
    query_slot: np.ndarray
    key_slots: np.ndarray

    @property
    def window_mask(self):
        """(length, length) bool, key k in the window of query q (for the global masked path)."""
        length = len(self.keys)
        mask = np.zeros((length, length), bool)
        mask[np.arange(length)[:, None], self.keys] = True
        return mask


def _choose_block(group_length, window):
    """Queries per tile: the fewest (query, key) scores per tile, plus the cost of its duplicated region.

    A tile of ``B`` queries scores ``B * (B + K - 1)`` pairs of which ``B * K`` are in a window;
    small tiles waste fewer pairs but gather (and, in the backward pass, scatter) a region of
    ``B + K - 1`` keys for only ``B`` queries. Per axis the cost is taken as
    ``tiles * region * (B + _REGION_COST)``; in 2-D the costs multiply. For K = 7 this picks B = 4
    (region 10) on 16, 32 or 64 pixels, and one tile of the whole axis on 8 pixels (where the
    duplicated regions would cost more than the masked keys they save). Blocks that do not divide
    the axis pay for the padded queries of their last tile (`math.ceil`).
    """

    def cost(block):
        region = min(block + window - 1, group_length)
        return math.ceil(group_length / block) * region * (block + _REGION_COST)

    return min(range(1, group_length + 1), key=lambda block: (cost(block), -block))


def tile_axis(length, window, dilation=1, block=None):
    """The `AxisTiling` of an axis (`window` already clipped to the axis, see `Neighbourhood`)."""
    half = window // 2
    group_lengths = [len(range(g, length, dilation)) for g in range(dilation)]
    block = block or _choose_block(min(group_lengths), window)
    region = min(block + window - 1, max(group_lengths))
    keys = window_starts(length, window, dilation, half)[:, None] + dilation * np.arange(window)
    queries, regions, region_real = [], [], []
    for group in range(dilation):
        members = np.arange(group, length, dilation)
        starts = np.clip(np.arange(len(members)) - half, 0, len(members) - window)
        real = min(region, len(members))
        for first in range(0, len(members), block):
            chunk = np.arange(first, min(first + block, len(members)))
            queries.append(members[np.pad(chunk, (0, block - len(chunk)), mode="edge")])
            region_start = min(starts[first], len(members) - real)
            slots = region_start + np.arange(real)
            regions.append(members[np.pad(slots, (0, region - real), mode="edge")])
            region_real.append(np.arange(region) < real)
    queries, regions, region_real = np.array(queries), np.array(regions), np.array(region_real)
    # Key r is in the window of query i iff it is one of the query's window keys (and a real slot).
    in_window = (regions[:, None, :, None] == keys[queries][:, :, None, :]).any(-1)
    mask = in_window & region_real[:, None, :]
    query_tile, query_slot = np.zeros(length, int), np.zeros(length, int)
    for tile in range(len(queries)):
        for slot in range(block):
            position = queries[tile, slot]
            if slot == 0 or position != queries[tile, slot - 1]:  # the first copy of a repeated query
                query_tile[position], query_slot[position] = tile, slot
    key_slots = np.array(
        [
            [np.flatnonzero((regions[query_tile[p]] == key) & region_real[query_tile[p]])[0] for key in keys[p]]
            for p in range(length)
        ]
    )
    return AxisTiling(keys, queries, regions, mask, query_tile, query_slot, key_slots)


def check_window(window, dilation, length, name="window"):
    """Raises ValueError unless a window of `window` with `dilation` fits an axis of `length` (NATTEN's rule)."""
    if dilation > 1 and window * dilation > length:
        raise ValueError(
            f"A window of {window} with dilation {dilation} needs at least {window * dilation} positions "
            f"per axis (window * dilation <= map side, NATTEN's rule); the map has {length}. "
            f"Received: {name}={window}, dilation={dilation}"
        )


class Neighbourhood:
    """The windows of every query of a ``height x width`` map, as tiles (static NumPy tables).

    Args:
        height, width: the feature map.
        window: (Kh, Kw) odd window sides; a side longer than the map (dilation 1) is clipped.
        dilation: (dh, dw) dilations.
        flat: if True, ``window`` is ``(1, K)`` over the row-major token sequence (a 1-D window of
            ``K`` consecutive tokens, for `AttentionSpan` with ``span_dims=1``).

    Attributes (``T = height * width``, ``n`` tiles of ``Bq`` queries and ``Rk`` keys):
        keys_per_query: ``K*K`` (or K), the keys of every query.
        key_indices: (T, keys_per_query) int32, flat (row-major) key positions of every query's
            window, in row-major window order.
        query_index: (n, Bq) int32, flat positions of each tile's queries.
        region_index: (n, Rk) int32, flat positions of each tile's keys.
        mask: (n, Bq, Rk) bool, key in the query's window.
        untile_index: (T,) int32, the slot ``tile * Bq + i`` of every query.
        window_slot_index: (T, keys_per_query) int32, the slot ``(tile * Bq + i) * Rk + r`` of
            every (query, window key).
        row_shift, col_shift: (n, Bq, Rk) int32, true shifts key - query of every tile pair.
        offset: (n, Bq, Rk) int32, flat key - flat query (the 1-D span's offset).
    """

    def __init__(self, height, width, window, dilation=(1, 1), flat=False):
        self.height, self.width, self.flat = height, width, bool(flat)
        lengths = (1, height * width) if flat else (height, width)
        self.dilation = tuple(dilation)
        self.window = tuple(min(k, n) if d == 1 else k for k, n, d in zip(window, lengths, self.dilation))
        for k, n, d in zip(window, lengths, self.dilation):
            check_window(k, d, n)
        check_tensor_bytes(
            "The window's index tables (int32, one row of keys per query)",
            4 * height * width * self.window[0] * self.window[1],
            f"height={height}, width={width}, window={tuple(window)}",
        )
        rows, cols = (tile_axis(n, k, d) for n, k, d in zip(lengths, self.window, self.dilation))
        self.tilings = rows, cols
        cols_n, cols_b, cols_r = cols.queries.shape[0], cols.queries.shape[1], cols.regions.shape[1]
        length_b = lengths[1]

        def combine(a, b):  # (tiles_a, ..., A) x (tiles_b, ..., B) -> (tiles_a * tiles_b, A * B)
            return (a[:, None, :, None] * length_b + b[None, :, None, :]).reshape(
                a.shape[0] * b.shape[0], a.shape[1] * b.shape[1]
            )

        self.query_index = combine(rows.queries, cols.queries).astype("int32")
        self.region_index = combine(rows.regions, cols.regions).astype("int32")
        tiles = self.query_index.shape[0]
        self.mask = (rows.mask[:, None, :, None, :, None] & cols.mask[None, :, None, :, None, :]).reshape(
            tiles, self.query_index.shape[1], self.region_index.shape[1]
        )
        self.keys_per_query = self.window[0] * self.window[1]
        self.key_indices = (
            (rows.keys[:, None, :, None] * length_b + cols.keys[None, :, None, :])
            .reshape(height * width, self.keys_per_query)
            .astype("int32")
        )
        # Where each query and each of its window keys sit in the tile layout.
        tile = rows.query_tile[:, None] * cols_n + cols.query_tile[None, :]
        slot = rows.query_slot[:, None] * cols_b + cols.query_slot[None, :]
        self.untile_index = (tile * self.query_index.shape[1] + slot).reshape(-1).astype("int32")
        region_slot = (rows.key_slots[:, None, :, None] * cols_r + cols.key_slots[None, :, None, :]).reshape(
            height * width, self.keys_per_query
        )
        self.window_slot_index = (self.untile_index[:, None] * self.region_index.shape[1] + region_slot).astype("int32")
        query_row, query_col = np.divmod(self.query_index[:, :, None], width)
        key_row, key_col = np.divmod(self.region_index[:, None, :], width)
        self.row_shift = (key_row - query_row).astype("int32")
        self.col_shift = (key_col - query_col).astype("int32")
        self.offset = (self.region_index[:, None, :] - self.query_index[:, :, None]).astype("int32")

    @property
    def shift_index(self):
        """(n, Bq, Rk) int32: index of every tile pair's shift in a flattened (2H-1, 2W-1) shift table."""
        return (self.row_shift + self.height - 1) * (2 * self.width - 1) + self.col_shift + self.width - 1

    @property
    def tile_pairs(self):
        """(query, key) scores the tiles compute: ``n * Bq * Rk`` (``T^2`` for global attention)."""
        return self.mask.size

    @property
    def axis_shift_counts(self):
        """The number of distinct row shifts and of distinct column shifts among the tile pairs."""
        return tuple(int(shift.max() - shift.min()) + 1 for shift in (self.row_shift, self.col_shift))

    def window_mask(self):
        """(T, T) bool, key in the window of query: the mask of the global path (which is O(T^2) anyway)."""
        tokens = self.height * self.width
        mask = np.zeros((tokens, tokens), bool)
        mask[np.arange(tokens)[:, None], self.key_indices] = True
        return mask

    def axis_masks(self):
        """(H, H) and (W, W) bool: the row and column windows, whose product is the 2-D window."""
        rows, columns = self._axis_tilings()
        return rows.window_mask, columns.window_mask

    def axis_window_keys(self):
        """(H, Kh) and (W, Kw) int: the keys of every row's and every column's window, in increasing order."""
        rows, columns = self._axis_tilings()
        return rows.keys, columns.keys

    @property
    def axis_pair_index(self):
        """(n, Bq, Rk) int32 twice: every tile pair's index in a flattened (H, H) table of (query row, key row) and
        in a flattened (W, W) table of (query column, key column)."""
        self._axis_tilings()  # a 1-D window over the token sequence has no rows and columns: its error
        query_row, query_col = np.divmod(self.query_index[:, :, None], self.width)
        key_row, key_col = np.divmod(self.region_index[:, None, :], self.width)
        return (query_row * self.height + key_row).astype("int32"), (query_col * self.width + key_col).astype("int32")

    def _axis_tilings(self):
        if self.flat:
            raise ValueError("A 1-D window over the token sequence has no row and column windows.")
        return self.tilings


@functools.lru_cache(maxsize=64)
def get_neighbourhood(height, width, window, dilation=(1, 1), flat=False):
    """The cached `Neighbourhood` of a grid (its tables are static; one per grid and window)."""
    return Neighbourhood(height, width, tuple(window), tuple(dilation), flat)


def window_pair(name, value, dims=2):
    """A window (odd: a query sits at its center) as a tuple of `dims` ints; ValueError naming `name`.

    `value` is an odd positive int, or (``dims == 2``) a pair of them.
    """
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,) * dims
    valid = len(items) == dims and all(
        isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1 and k % 2 == 1 for k in items
    )
    if not valid:
        expected = "an odd positive integer" + (" or a pair of them" if dims == 2 else "")
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")
    return tuple(int(k) for k in items)


def window_arguments(window, dilation=1):
    """A layer's `window` and `dilation` arguments as ``(window pair or None, dilation pair)``.

    The one check of their types and of their pairing (a dilation needs a window); whether the
    window fits a map is checked by `Neighbourhood`, once the map is known. ValueError naming
    the argument.
    """
    pair = dilation_pair(dilation)
    if window is None and pair != (1, 1):
        raise ValueError(f"`dilation` needs a `window`. Received: dilation={dilation!r}, window=None")
    return (None if window is None else window_pair("window", window)), pair


def dilation_pair(value):
    """`value` (a positive int or a pair of them) as a pair of ints; ValueError naming `dilation`."""
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if not (
        len(items) == 2 and all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1 for d in items)
    ):
        raise ValueError(f"`dilation` must be a positive integer or a pair of them. Received: dilation={value!r}")
    return tuple(int(d) for d in items)
