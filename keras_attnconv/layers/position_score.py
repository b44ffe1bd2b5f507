"""The base class of position scores: the last two terms of eq. (8) for 2-D images.

A position score layer owns the relative encoding ``r_delta`` of every pixel
shift ``delta = k - q`` (row shift, column shift) and, optionally, one vector
``v_h`` per head. It answers two questions for a static ``height x width`` grid:

- ``position_scores(height, width)``: ``v_h^T r_delta`` for every head and
  every (query, key) pair, shape ``(num_heads, H*W, H*W)``, float32. This is
  the position-bias term of eq. (8); it does not depend on the batch.
- ``relative_encoding(height, width)``: ``r_delta`` itself, shape
  ``(H*W, H*W, encoding_dim)``, float32, used by the content-position term
  ``X_q W_qry W_key_hat r_delta`` (see ``content_position_scores``).

Windowed (local) attention never forms a (query, key) table of the whole map:
it reads the same functions per distinct shift, ``shift_scores`` (heads,
2H-1, 2W-1) and ``shift_encoding`` (2H-1, 2W-1, encoding_dim), and gathers
them for the pairs of its tiles (`windowed_content_position_scores`).

Pixels are indexed row-major (``p = i * width + j``); the shift grid is in
`keras_attnconv.layers.shift_geometry`. All weights are float32 and never
autocast, so scores stay float32 under mixed precision.
"""

import functools

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.shift_geometry import centered_shifts, combine_axis_scores, squares_from_nearest
from keras_attnconv.layers.validation import grid_size
from keras_attnconv.utils.checks import check_bool, check_positive_int

# Centers are initialised Delta_h ~ N(0, 2 I) (Section 4.2).
PAPER_CENTER_STDDEV = 2.0**0.5
# The official code's: N(0, 2^2) per coordinate (its gaussian_init_mu_std = 2).
OFFICIAL_CENTER_STDDEV = 2.0


class PositionScore(keras.layers.Layer):
    """Base class of position score layers (do not instantiate directly).

    Calling the layer on a feature map ``(batch, H, W, C)`` returns the
    batch-independent position scores ``(num_heads, H*W, H*W)``; only the static
    shape of the input is used.

    Args:
        num_heads: int, number of attention heads.
        head_vectors: bool, whether to create the per-head vectors ``v_h``.
            Set False when the layer only provides ``r_delta`` to the
            content-position term (no position-bias term), so that no weight
            goes unused.
    """

    #: dimension of r_delta; subclasses set it (or compute it in __init__).
    encoding_dim = None
    #: whether scores are a row term plus a column term (see `axis_scores`).
    separable = False
    #: whether scores are ``-sum_d w_hd (delta_d - Delta_hd)^2`` (`axis_square_weights`), whose maximum over any
    #: window of keys has a closed form: `peaked_axis_scores` put it at an exact 0.
    peaks_in_closed_form = False
    #: names of the weights that place and shape the heads (no weight decay in the official recipe).
    center_and_spread_weights = ()

    def __init__(self, num_heads, head_vectors=True, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_bool("head_vectors", head_vectors)
        self.num_heads = int(num_heads)
        self.head_vectors = head_vectors

    @classmethod
    def from_arguments(cls, num_heads, key_dim=None, **kwargs):
        """The score `get_position_score` builds from a name and these arguments.

        ``key_dim`` is the query/key width of the attention the score serves;
        a score whose encoding needs a width overrides this to default to it.
        """
        return cls(num_heads, **kwargs)

    def build(self, input_shape):
        self.grid_shape = grid_size(input_shape)
        self.built = True

    def _add_float32_weight(self, name, shape, initializer):
        """A float32 weight, never autocast: scores stay float32 under any dtype policy."""
        return self.add_weight(name=name, shape=shape, dtype="float32", autocast=False, initializer=initializer)

    def call(self, inputs):
        height, width = grid_size(inputs.shape)
        return self.position_scores(height, width)

    def compute_output_shape(self, input_shape):
        height, width = grid_size(input_shape)
        return (self.num_heads, height * width, height * width)

    def compute_output_spec(self, inputs):
        # Scores are float32 under any policy (float32 weights, never autocast), not the compute dtype.
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype="float32")

    def _require_head_vectors(self):
        if not self.head_vectors:
            raise ValueError(
                f"{self.__class__.__name__} was created with head_vectors=False, so it has "
                "no per-head vectors and cannot produce position scores."
            )

    def position_scores(self, height, width):
        """``v_h^T r_delta`` for all heads and pixel pairs: (heads, H*W, H*W), float32."""
        return combine_axis_scores(*self.axis_scores(height, width))

    def axis_scores(self, height, width):
        """Row and column scores, (heads, H, H) and (heads, W, W), of a separable score.

        ``score(q, k) = row[h, q_row, k_row] + column[h, q_col, k_col]``, so the
        softmax over the grid is the outer product of a row softmax and a
        column softmax, which the attention uses to apply a head as a row pass
        and a column pass.
        """
        if self.peaks_in_closed_form:
            return self._weighted_squares(height, width, ops.square, ops.square)
        raise NotImplementedError(f"{self.__class__.__name__} scores are not separable by axis.")

    def axis_square_weights(self):
        """``w_hd`` of scores ``-sum_d w_hd (delta_d - Delta_hd)^2`` that peak in closed form: (heads,) per axis."""
        raise NotImplementedError(f"{self.__class__.__name__} scores are not weighted squared distances.")

    def peaked_axis_scores(self, height, width, window_keys=None):
        """`axis_scores` less each query's maximum over its keys, which is then an exact 0, where it has a closed form.

        The separable attention's softmaxes take these: their dominant score is 0 however XLA
        rounds the others in each kernel it recomputes them in. For a far center and a huge
        alpha, scores of ~-1e10 rounded otherwise in two kernels left the dominant one above
        their maximum and gave NaN (JAX, XLA's CPU code unoptimised). Without a closed form:
        `axis_scores`, whose maximum `position_softmax` subtracts as before.

        Args:
            window_keys: None (every key), or the keys of each query's window along the rows and
                along the columns, int NumPy (H, Kh) and (W, Kw) (`Neighbourhood.axis_window_keys`):
                the maximum over each query's window is then the exact 0. Outside it the scores
                may be positive; the attention masks them.
        """
        if not self.peaks_in_closed_form:
            return self.axis_scores(height, width)
        row_keys, column_keys = (None, None) if window_keys is None else window_keys
        return self._weighted_squares(
            height,
            width,
            functools.partial(squares_from_nearest, window_keys=row_keys),
            functools.partial(squares_from_nearest, window_keys=column_keys),
        )

    def _weighted_squares(self, height, width, row_square, column_square):
        """``-w_hd square(shift - Delta_hd)`` per axis, of ``ops.square`` or `squares_from_nearest` per axis."""
        row, col = centered_shifts(self.centers, height, width)
        # Reshaped, not indexed with new axes: in TensorFlow's graph, whose optimiser reorders a chain of broadcast
        # products, a (heads, 2)[:, 0:1, None] slice met the squares as (heads, 1) and failed ("Incompatible shapes").
        row_weights, column_weights = (ops.reshape(w, (-1, 1, 1)) for w in self.axis_square_weights())
        return -row_weights * row_square(row), -column_weights * column_square(col)

    def peaked_position_scores(self, height, width, window_keys=None):
        """`position_scores` less each query's maximum over its keys: `peaked_axis_scores` combined, where they peak.

        A constant per query, which softmax ignores, with or without content terms beside it.
        ``window_keys``: see `peaked_axis_scores`.
        """
        if not self.peaks_in_closed_form:
            return self.position_scores(height, width)
        return combine_axis_scores(*self.peaked_axis_scores(height, width, window_keys))

    def relative_encoding(self, height, width):
        """``r_delta`` for all pixel pairs: (H*W, H*W, encoding_dim), float32."""
        raise NotImplementedError

    def content_position_scores(self, queries, height, width):
        """Content-position term ``q^T r_delta`` of eq. (8).

        Args:
            queries: tensor (batch, H*W, heads, encoding_dim) in the compute
                dtype: the queries already mapped into the encoding space
                (``X_q W_qry W_key_hat``). The encoding is cast to their dtype
                (not the queries to float32: no float32 copy of a
                (batch, tokens, heads, channels) tensor under mixed precision).
            height, width: static grid size.

        Returns:
            float32 tensor (batch, heads, H*W, H*W).
        """
        encoding = ops.cast(self.relative_encoding(height, width), queries.dtype)
        return ops.cast(ops.einsum("bqhd,qkd->bhqk", queries, encoding), "float32")

    def axis_shift_table(self, height, width):
        """``r_delta`` as a row part plus a column part, or None (the default: not factorised so).

        A score whose encoding is ``r_delta = r_row[delta_1] + r_col[delta_2]`` returns a float32
        (encoding_dim, (2H-1) + (2W-1)) table: the ``r_row`` of every row shift (column
        ``delta_1 + H - 1``) and then the ``r_col`` of every column shift. The content-position term
        is then each query's products with these columns, read at every pair's two shifts
        (`shift_geometry.pair_scores_from_axis_shifts`), and the attention folds the table into
        its query projection (`attention_paths.global_score_parts`).
        """
        return None

    def content_position_multiply_adds(self, height, width, window=None):
        """Multiply-adds of the content-position term per example and head (for FLOP counts).

        ``window`` is the (Kh, Kw) window of windowed attention (None: every token is a key).
        """
        tokens = height * width
        keys = tokens if window is None else window[0] * window[1]
        return tokens * keys * self.encoding_dim

    def windowed_content_position_multiply_adds(self, neighbourhood, folded_channels=None):
        """Multiply-adds per example and head of `windowed_content_position_scores` (one per tile pair and channel).

        ``folded_channels``: the input channels when the queries are folded into a kernel (only
        scores with per-axis tables fold them, see `LearnedRelativeScore.windowed_axis_scores`).
        """
        return neighbourhood.tile_pairs * self.encoding_dim

    def shift_scores(self, height, width):
        """``v_h^T r_delta`` of every shift ``delta`` on the grid: (heads, 2H-1, 2W-1), float32.

        Index ``[h, delta_1 + H - 1, delta_2 + W - 1]``. The default reads a separable
        score's axis tables (whose entries depend on the shift only) at one pair per shift.
        """
        row_scores, column_scores = self.axis_scores(height, width)
        return _per_shift(row_scores, height)[:, :, None] + _per_shift(column_scores, width)[:, None, :]

    def shift_encoding(self, height, width):
        """``r_delta`` of every shift on the grid: (2H-1, 2W-1, encoding_dim), float32 (see `shift_scores`)."""
        raise NotImplementedError

    def windowed_content_position_scores(self, queries, neighbourhood):
        """Content-position term ``q^T r_delta`` for the tile pairs of windowed attention.

        Args:
            queries: (batch, tiles, Bq, heads, encoding_dim) in the compute dtype, the tiles'
                queries already mapped into the encoding space.
            neighbourhood: the `keras_attnconv.layers.neighbourhood.Neighbourhood` of the grid.

        Returns:
            float32 (batch, tiles, Bq, heads, Rk). The encoding of each tile pair is gathered
            from `shift_encoding` (batch-independent, ``tiles * Bq * Rk * encoding_dim`` values).
        """
        height, width = neighbourhood.height, neighbourhood.width
        table = ops.reshape(self.shift_encoding(height, width), (-1, self.encoding_dim))
        encoding = ops.cast(ops.take(table, neighbourhood.shift_index, axis=0), queries.dtype)
        return ops.cast(ops.einsum("bnihe,nire->bnihr", queries, encoding), "float32")

    def get_config(self):
        config = super().get_config()
        config.update({"num_heads": self.num_heads, "head_vectors": self.head_vectors})
        return config


def _per_shift(axis_scores, length):
    """(heads, L, L) scores indexed by (query, key) -> (heads, 2L-1) indexed by shift + L - 1.

    Shift ``s`` is read at the pair ``(max(0, -s), max(0, -s) + s)``.
    """
    shifts = np.arange(-(length - 1), length)
    query = np.maximum(0, -shifts)
    index = (query * length + query + shifts).astype("int32")
    return ops.take(ops.reshape(axis_scores, (axis_scores.shape[0], length * length)), index, axis=1)
