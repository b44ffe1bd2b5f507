"""The paper's learned relative encoding: one embedding per row shift and per column shift."""

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.fan_in_uniform import initializer_for
from keras_attnconv.layers.position_score import PositionScore
from keras_attnconv.layers.shift_geometry import (
    axis_shifts,
    combine_axis_features,
    sum_row_and_column_scores,
    take_per_pair,
)
from keras_attnconv.layers.validation import get_initializer, independent
from keras_attnconv.utils.checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_attnconv")
class LearnedRelativeScore(PositionScore):
    """Learned relative encoding: ``r_delta = (row_emb[delta_1], col_emb[delta_2])``.

    ``D_p / 2`` dimensions embed the row shift and ``D_p / 2`` the column shift
    (``encoding_dim = D_p``). The position score of head h is
    ``v_h^T r_delta``; it depends on the shift only.

    Args:
        num_heads: int, number of attention heads.
        embedding_dim: even int >= 2, ``D_p``. Built by name inside an
            attention (`get_position_score`), it defaults to the attention's
            ``key_dim`` (its even part: ``key_dim - key_dim % 2``).
        max_position: int or None. Largest grid side the tables cover
            (``2 * max_position - 1`` shifts per axis). None sizes them to the
            grid the layer is built on.
        embeddings_initializer: initializer of the shift tables (and of ``v``
            unless `head_vectors_initializer` is given).
        head_vectors_initializer: None or the initializer of the per-head
            vectors ``v`` (the official code's row and column ``nn.Linear``
            maps to the heads: a `FanInUniform` is bounded by ``axis_dim``).
        head_vectors: see `PositionScore`.

    Example:
    >>> score = LearnedRelativeScore(num_heads=9, embedding_dim=16)
    >>> keras.ops.shape(score(keras.ops.zeros((2, 8, 8, 4))))
    (9, 64, 64)
    """

    separable = True

    def __init__(
        self,
        num_heads,
        embedding_dim,
        max_position=None,
        embeddings_initializer=None,
        head_vectors=True,
        head_vectors_initializer=None,
        **kwargs,
    ):
        super().__init__(num_heads, head_vectors=head_vectors, **kwargs)
        check_positive_int("embedding_dim", embedding_dim)
        if embedding_dim < 2 or embedding_dim % 2:
            raise ValueError(
                "`embedding_dim` must be an even number >= 2: half of it embeds the row shift, half the "
                f"column shift. Received: embedding_dim={embedding_dim}"
            )
        check_positive_int("max_position", max_position, allow_none=True)
        self.embedding_dim = int(embedding_dim)
        self.max_position = None if max_position is None else int(max_position)
        self.embeddings_initializer = get_initializer(
            "embeddings_initializer", embeddings_initializer or keras.initializers.RandomNormal(stddev=0.02)
        )
        self.head_vectors_initializer = (
            None
            if head_vectors_initializer is None
            else get_initializer("head_vectors_initializer", head_vectors_initializer)
        )
        self.axis_dim = self.embedding_dim // 2
        self.encoding_dim = 2 * self.axis_dim

    @classmethod
    def from_arguments(cls, num_heads, key_dim=None, **kwargs):
        kwargs.setdefault("embedding_dim", key_dim if key_dim is None else key_dim - key_dim % 2)
        return cls(num_heads, **kwargs)

    def build(self, input_shape):
        super().build(input_shape)
        height, width = self.grid_shape
        if self.max_position is not None and max(height, width) > self.max_position:
            raise ValueError(
                f"The grid {height}x{width} is larger than `max_position`={self.max_position}. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        self.row_size = self.max_position or height
        self.col_size = self.max_position or width

        def table(name, size, initializer):
            return self._add_float32_weight(name, (size, self.axis_dim), initializer)

        self.row_embeddings = table("row_embeddings", 2 * self.row_size - 1, independent(self.embeddings_initializer))
        self.col_embeddings = table("col_embeddings", 2 * self.col_size - 1, independent(self.embeddings_initializer))
        if self.head_vectors:
            # `v` maps an axis' axis_dim encoding to one score per head: axis_dim is its fan-in.
            vectors = self.head_vectors_initializer or self.embeddings_initializer
            self.row_head_vectors = table("row_head_vectors", self.num_heads, initializer_for(vectors, self.axis_dim))
            self.col_head_vectors = table("col_head_vectors", self.num_heads, initializer_for(vectors, self.axis_dim))

    def _axis_tables(self, height, width):
        """Embeddings of every (query, key) shift per axis: (H, H, d) and (W, W, d)."""
        if height > self.row_size or width > self.col_size:
            raise ValueError(
                f"The grid {height}x{width} exceeds the relative tables built for {self.row_size}x{self.col_size}."
            )
        row_index = (axis_shifts(height) + self.row_size - 1).astype("int32")
        col_index = (axis_shifts(width) + self.col_size - 1).astype("int32")
        return (ops.take(self.row_embeddings, row_index, axis=0), ops.take(self.col_embeddings, col_index, axis=0))

    def axis_scores(self, height, width):
        self._require_head_vectors()
        rows, cols = self._axis_tables(height, width)
        return (
            ops.einsum("ikd,hd->hik", rows, self.row_head_vectors),
            ops.einsum("jld,hd->hjl", cols, self.col_head_vectors),
        )

    def relative_encoding(self, height, width):
        rows, cols = self._axis_tables(height, width)
        zeros_r = ops.zeros_like(rows)
        zeros_c = ops.zeros_like(cols)
        return combine_axis_features(
            ops.concatenate([rows, zeros_r], axis=-1), ops.concatenate([zeros_c, cols], axis=-1)
        )

    def axis_shift_table(self, height, width):
        # Row shift d1 is the column (row_emb[d1], 0), column shift d2 the column (0, col_emb[d2]).
        rows, cols = self._every_shift(height, width)
        return ops.concatenate(
            [
                ops.pad(ops.transpose(rows), [[0, self.axis_dim], [0, 0]]),
                ops.pad(ops.transpose(cols), [[self.axis_dim, 0], [0, 0]]),
            ],
            axis=1,
        )

    def content_position_scores(self, queries, height, width):
        # Factorised form: q.r_delta = q_row.row_emb[d1] + q_col.col_emb[d2], never
        # materialising the (H*W, H*W, D_p) encoding.
        rows, cols = (ops.cast(table, queries.dtype) for table in self._axis_tables(height, width))
        batch = ops.shape(queries)[0]
        heads = queries.shape[2]
        grid = ops.reshape(queries, (batch, height, width, heads, self.encoding_dim))
        row_scores = ops.einsum("bijhd,ikd->bhijk", grid[..., : self.axis_dim], rows)
        col_scores = ops.einsum("bijhd,jld->bhijl", grid[..., self.axis_dim :], cols)
        return sum_row_and_column_scores(row_scores, col_scores)

    def content_position_multiply_adds(self, height, width, window=None):
        # The factorised form above: each query meets H row and W column embeddings (in a window,
        # the Kh row and Kw column shifts of its window).
        rows, cols = (height, width) if window is None else window
        return height * width * self.axis_dim * (rows + cols)

    def shift_encoding(self, height, width):
        rows, cols = self._every_shift(height, width)
        shape = (2 * height - 1, 2 * width - 1, self.axis_dim)
        return ops.concatenate(
            [ops.broadcast_to(rows[:, None, :], shape), ops.broadcast_to(cols[None, :, :], shape)], axis=-1
        )

    def _every_shift(self, height, width):
        """The table rows of every shift of the grid: row shifts (2H-1, axis_dim), column shifts (2W-1, axis_dim)."""
        return (
            self._shift_table(self.row_embeddings, self.row_size, np.arange(-(height - 1), height), height, width),
            self._shift_table(self.col_embeddings, self.col_size, np.arange(-(width - 1), width), height, width),
        )

    def _shift_table(self, embeddings, size, shifts, height, width):
        """The rows of one axis' table for the shifts `shifts` (int array): (len(shifts), axis_dim)."""
        self._axis_tables(height, width)  # checks the grid against the tables
        return ops.take(embeddings, (shifts + size - 1).astype("int32"), axis=0)

    def windowed_content_position_multiply_adds(self, neighbourhood, folded_channels=None):
        # Every query slot meets each distinct row and column shift of the tiles, with its axis_dim
        # encoding channels, or its input channels when folded (`windowed_axis_scores`).
        width = folded_channels or self.axis_dim
        return neighbourhood.query_index.size * width * sum(neighbourhood.axis_shift_counts)

    def windowed_content_position_scores(self, queries, neighbourhood):
        return self.windowed_axis_scores(
            lambda part, table: ops.einsum("bnihe,se->bnihs", queries[..., part], ops.cast(table, queries.dtype)),
            neighbourhood,
        )

    def windowed_axis_scores(self, per_shift_scores, neighbourhood):
        """The content-position term on the tile pairs, from its scores per row and per column shift.

        Factorised as on the global path: q_row.row_emb[d1] + q_col.col_emb[d2]. Each query meets
        the few row (column) shifts its map spans, then every pair picks its shift's entry.

        Args:
            per_shift_scores: ``(part, table) -> (batch, tiles, Bq, heads, shifts)``, the queries'
                encoding channels `part` (a slice: the row or the column half) against a float32
                (shifts, axis_dim) table of that axis' embeddings.
            neighbourhood: the grid's `Neighbourhood`.

        Returns:
            float32 (batch, tiles, Bq, heads, Rk).
        """
        axes = (
            (self.row_embeddings, self.row_size, neighbourhood.row_shift, slice(0, self.axis_dim)),
            (self.col_embeddings, self.col_size, neighbourhood.col_shift, slice(self.axis_dim, self.encoding_dim)),
        )
        total = 0.0
        for embeddings, size, shift, part in axes:
            low = int(shift.min())
            table = self._shift_table(
                embeddings, size, np.arange(low, int(shift.max()) + 1), neighbourhood.height, neighbourhood.width
            )
            per_shift = per_shift_scores(part, table)
            total = total + take_per_pair(ops.cast(per_shift, "float32"), shift - low)
        return total

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "embedding_dim": self.embedding_dim,
                "max_position": self.max_position,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "head_vectors_initializer": (
                    None
                    if self.head_vectors_initializer is None
                    else keras.initializers.serialize(self.head_vectors_initializer)
                ),
            }
        )
        return config
