"""Position score functions: the last two terms of eq. (8) for 2-D images.

A position score layer owns the relative encoding ``r_delta`` of every pixel
shift ``delta = k - q`` (row shift, column shift) and, optionally, one vector
``v_h`` per head. It answers two questions for a static ``height x width`` grid:

- ``position_scores(height, width)``: ``v_h^T r_delta`` for every head and
  every (query, key) pair, shape ``(num_heads, H*W, H*W)``, float32. This is
  the position-bias term of eq. (8); it does not depend on the batch.
- ``relative_encoding(height, width)``: ``r_delta`` itself, shape
  ``(H*W, H*W, encoding_dim)``, float32, used by the content-position term
  ``X_q W_qry W_key_hat r_delta`` (see ``content_position_scores``).

Pixels are indexed row-major (``p = i * width + j``). Every score is built from
per-axis shift tables of shape (H, H) and (W, W), so nothing of size
``(H*W)^2`` is stored as a constant. All weights are float32 and never
autocast, so scores stay float32 under mixed precision.
"""

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.validation import grid_size
from keras_attnconv.utils import check_positive_int, closest_names

# Centres are initialised Delta_h ~ N(0, 2 I) (Section 4.2).
PAPER_CENTER_STDDEV = 2.0**0.5

_PACKAGE = "keras_attnconv"


def axis_shifts(length):
    """Key index minus query index along one axis: ``shifts[q, k] = k - q``."""
    positions = np.arange(length, dtype="float32")
    return positions[None, :] - positions[:, None]


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

    def __init__(self, num_heads, head_vectors=True, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        self.num_heads = int(num_heads)
        self.head_vectors = bool(head_vectors)

    def build(self, input_shape):
        self.grid_shape = grid_size(input_shape)
        self.built = True

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
        raise NotImplementedError(f"{self.__class__.__name__} scores are not separable by axis.")

    def relative_encoding(self, height, width):
        """``r_delta`` for all pixel pairs: (H*W, H*W, encoding_dim), float32."""
        raise NotImplementedError

    def content_position_scores(self, queries, height, width):
        """Content-position term ``q^T r_delta`` of eq. (8).

        Args:
            queries: float32 tensor (batch, H*W, heads, encoding_dim): the
                queries already mapped into the encoding space
                (``X_q W_qry W_key_hat``).
            height, width: static grid size.

        Returns:
            float32 tensor (batch, heads, H*W, H*W).
        """
        encoding = self.relative_encoding(height, width)
        return ops.einsum("bqhd,qkd->bhqk", queries, encoding)

    def attention_moments(self, height, width):
        """Mean and covariance of each head's attention over shifts.

        Computed for the query pixel closest to the grid centre from the
        position scores alone, so it applies to any encoding (learned too).

        Returns:
            (means, covariances): NumPy arrays (heads, 2) and (heads, 2, 2) in
            (row shift, column shift) coordinates.
        """
        self._require_head_vectors()
        query = (height // 2) * width + width // 2
        scores = ops.convert_to_numpy(self.position_scores(height, width))[:, query, :]
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        rows, cols = np.divmod(np.arange(height * width), width)
        shifts = np.stack([rows - height // 2, cols - width // 2], axis=-1).astype("float64")
        means = probs @ shifts
        centred = shifts[None, :, :] - means[:, None, :]
        covariances = np.einsum("hk,hki,hkj->hij", probs, centred, centred)
        return means, covariances

    def get_config(self):
        config = super().get_config()
        config.update({"num_heads": self.num_heads, "head_vectors": self.head_vectors})
        return config


def _flat_encoding(row_features, column_features):
    """(H,H,D) and (W,W,D) per-axis features -> (H*W, H*W, D) summed features."""
    height, width = row_features.shape[0], column_features.shape[0]
    total = row_features[:, None, :, None, :] + column_features[None, :, None, :, :]
    return ops.reshape(total, (height * width, height * width, total.shape[-1]))


@keras.saving.register_keras_serializable(package=_PACKAGE)
class QuadraticScore(PositionScore):
    """Eq. (9) quadratic encoding: ``-alpha_h * ||delta - Delta_h||^2``.

    ``v_h = -alpha_h (1, -2 Delta_h1, -2 Delta_h2)`` and
    ``r_delta = (||delta||^2, delta_1, delta_2)``; ``v_h^T r_delta`` differs from
    ``-alpha_h ||delta - Delta_h||^2`` by a constant per query, which softmax
    ignores. Scores are computed in the centred form, which stays accurate for
    far centres and huge ``alpha`` (no cancellation of large terms). With
    ``alpha >= 46`` a head attends to the single pixel ``q + Delta_h`` in float32
    (Lemma 2).

    Args:
        num_heads: int, number of attention heads.
        center_stddev: float, standard deviation of the initial centres
            ``Delta_h ~ N(0, center_stddev^2 I)``; the paper's N(0, 2I) is the
            default.
        alpha_initializer: initializer of ``alpha``. Default 0.5, the isotropic
            Gaussian with unit covariance that the reference code starts from.
        head_vectors: see `PositionScore`.

    Example:
    >>> score = QuadraticScore(num_heads=9)
    >>> score(keras.ops.zeros((1, 16, 16, 32))).shape
    (9, 256, 256)
    """

    encoding_dim = 3
    separable = True

    def __init__(self, num_heads, center_stddev=PAPER_CENTER_STDDEV, alpha_initializer=0.5,
                 head_vectors=True, **kwargs):
        super().__init__(num_heads, head_vectors=head_vectors, **kwargs)
        if not center_stddev >= 0:
            raise ValueError(f"`center_stddev` must be >= 0. Received: center_stddev={center_stddev}")
        self.center_stddev = float(center_stddev)
        self.alpha_initializer = alpha_initializer

    def build(self, input_shape):
        super().build(input_shape)
        if self.head_vectors:
            self.centers = self.add_weight(
                name="centers", shape=(self.num_heads, 2), dtype="float32", autocast=False,
                initializer=keras.initializers.RandomNormal(stddev=self.center_stddev),
            )
            alpha_init = self.alpha_initializer
            if isinstance(alpha_init, (int, float)):
                alpha_init = keras.initializers.Constant(float(alpha_init))
            self.alpha = self.add_weight(
                name="alpha", shape=(self.num_heads,), dtype="float32", autocast=False,
                initializer=alpha_init,
            )

    @property
    def covariances(self):
        """Covariance ``I / (2 alpha_h)`` of each head's Gaussian, NumPy (heads, 2, 2)."""
        alpha = ops.convert_to_numpy(self.alpha).astype("float64")
        return np.eye(2)[None] / (2.0 * alpha[:, None, None])

    def head_vectors_v(self):
        """The eq. (9) vectors ``v_h = -alpha_h (1, -2 Delta_h1, -2 Delta_h2)``: (heads, 3)."""
        self._require_head_vectors()
        alpha = ops.convert_to_tensor(self.alpha)[:, None]
        ones = ops.ones_like(alpha)
        return -alpha * ops.concatenate([ones, -2.0 * ops.convert_to_tensor(self.centers)], axis=-1)

    def axis_scores(self, height, width):
        self._require_head_vectors()
        alpha = ops.convert_to_tensor(self.alpha)[:, None, None]
        row, col = centred_shifts(self.centers, height, width)
        return -alpha * ops.square(row), -alpha * ops.square(col)

    def relative_encoding(self, height, width):
        rows, cols = axis_shifts(height), axis_shifts(width)
        zeros_r, zeros_c = np.zeros_like(rows), np.zeros_like(cols)
        row_features = np.stack([rows**2, rows, zeros_r], axis=-1)
        col_features = np.stack([cols**2, zeros_c, cols], axis=-1)
        return _flat_encoding(ops.convert_to_tensor(row_features), ops.convert_to_tensor(col_features))

    def get_config(self):
        config = super().get_config()
        alpha_init = self.alpha_initializer
        if not isinstance(alpha_init, (int, float)):
            alpha_init = keras.initializers.serialize(keras.initializers.get(alpha_init))
        config.update({"center_stddev": self.center_stddev, "alpha_initializer": alpha_init})
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class GaussianScore(PositionScore):
    """Appendix E generalised quadratic encoding (anisotropic Gaussian heads).

    ``score = -1/2 (delta - Delta_h)^T Sigma_h^{-1} (delta - Delta_h)`` with
    ``Sigma_h^{-1} = S_h S_h^T`` where ``S_h = Sigma_h^{-1/2}`` is learned (so the
    inverse covariance stays positive semi-definite), initialised to
    ``I + N(0, sigma_init_stddev^2)``. In eq. (8) form
    ``r_delta = (delta_1, delta_2, delta_1^2, delta_2^2, delta_1 delta_2)``.
    With ``S_h = sqrt(2 alpha) I`` it equals `QuadraticScore`.

    Args:
        num_heads: int, number of attention heads.
        center_stddev: float, std of the initial centres (paper: sqrt(2)).
        sigma_init_stddev: float, std of the noise added to the identity
            ``Sigma^{-1/2}`` at initialisation (paper: 0.01).
        diagonal: bool, axis-aligned heads (diagonal ``Sigma^{-1/2}``): the
            scores become separable by axis, which the attention's fast path uses.
        head_vectors: see `PositionScore`.

    Example:
    >>> score = GaussianScore(num_heads=9)
    >>> score(keras.ops.zeros((1, 8, 8, 4))).shape
    (9, 64, 64)
    """

    encoding_dim = 5

    def __init__(self, num_heads, center_stddev=PAPER_CENTER_STDDEV, sigma_init_stddev=0.01, diagonal=False,
                 head_vectors=True, **kwargs):
        super().__init__(num_heads, head_vectors=head_vectors, **kwargs)
        for name, value in (("center_stddev", center_stddev), ("sigma_init_stddev", sigma_init_stddev)):
            if not value >= 0:
                raise ValueError(f"`{name}` must be >= 0. Received: {name}={value}")
        self.center_stddev = float(center_stddev)
        self.sigma_init_stddev = float(sigma_init_stddev)
        self.diagonal = bool(diagonal)
        # Axis-aligned heads (diagonal covariance) are separable; full covariances are not.
        self.separable = self.diagonal

    def build(self, input_shape):
        super().build(input_shape)
        if self.head_vectors:
            self.centers = self.add_weight(
                name="centers", shape=(self.num_heads, 2), dtype="float32", autocast=False,
                initializer=keras.initializers.RandomNormal(stddev=self.center_stddev),
            )
            noise = keras.initializers.RandomNormal(stddev=self.sigma_init_stddev)
            if self.diagonal:
                # S_h = diag(s_h), Sigma_h^{-1} = diag(s_h^2), initialised 1 + N(0, sigma_init_stddev^2).
                self.inverse_sqrt_variances = self.add_weight(
                    name="inverse_sqrt_variances", shape=(self.num_heads, 2), dtype="float32", autocast=False,
                    initializer=lambda shape, dtype=None: 1.0 + noise(shape, dtype),
                )
                return
            identity = np.tile(np.eye(2, dtype="float32"), (self.num_heads, 1, 1))
            self.inverse_sqrt_covariance = self.add_weight(
                name="inverse_sqrt_covariance", shape=(self.num_heads, 2, 2), dtype="float32",
                autocast=False,
                initializer=lambda shape, dtype=None: ops.convert_to_tensor(identity) + noise(shape, dtype),
            )

    def inverse_covariance(self):
        """``Sigma_h^{-1} = S_h S_h^T`` as a tensor (heads, 2, 2)."""
        self._require_head_vectors()
        if self.diagonal:
            variances = ops.square(ops.convert_to_tensor(self.inverse_sqrt_variances))
            return variances[:, :, None] * ops.eye(2, dtype="float32")[None]
        sqrt = ops.convert_to_tensor(self.inverse_sqrt_covariance)
        return ops.einsum("hij,hkj->hik", sqrt, sqrt)

    def axis_scores(self, height, width):
        if not self.diagonal:
            return super().axis_scores(height, width)
        inverse_variances = ops.square(ops.convert_to_tensor(self.inverse_sqrt_variances))
        row, col = centred_shifts(self.centers, height, width)
        return (-0.5 * inverse_variances[:, 0, None, None] * ops.square(row),
                -0.5 * inverse_variances[:, 1, None, None] * ops.square(col))

    @property
    def covariances(self):
        """``Sigma_h`` as NumPy (heads, 2, 2); inf/huge for degenerate heads."""
        inverse = ops.convert_to_numpy(self.inverse_covariance()).astype("float64")
        return np.linalg.pinv(inverse)

    def position_scores(self, height, width):
        if self.diagonal:
            return super().position_scores(height, width)
        inverse = self.inverse_covariance()
        row, col = centred_shifts(self.centers, height, width)  # (h, H, H), (h, W, W)
        a = inverse[:, 0, 0, None, None]
        b = inverse[:, 0, 1, None, None]
        c = inverse[:, 1, 1, None, None]
        separable = combine_axis_scores(-0.5 * a * ops.square(row), -0.5 * c * ops.square(col))
        # The cross term -b * row_shift * col_shift is a product, not a sum, of axis terms.
        heads = self.num_heads
        cross = -b[:, :, None, :, None] * row[:, :, None, :, None] * col[:, None, :, None, :]
        cross = ops.reshape(cross, (heads, height * width, height * width))
        return separable + cross

    def relative_encoding(self, height, width):
        rows, cols = np.divmod(np.arange(height * width), width)
        d1 = (rows[None, :] - rows[:, None]).astype("float32")
        d2 = (cols[None, :] - cols[:, None]).astype("float32")
        return ops.convert_to_tensor(np.stack([d1, d2, d1**2, d2**2, d1 * d2], axis=-1))

    def get_config(self):
        config = super().get_config()
        config.update({"center_stddev": self.center_stddev, "sigma_init_stddev": self.sigma_init_stddev,
                       "diagonal": self.diagonal})
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LearnedRelativeScore(PositionScore):
    """Learned relative encoding: ``r_delta = (row_emb[delta_1], col_emb[delta_2])``.

    ``floor(D_p / 2)`` dimensions embed the row shift and ``floor(D_p / 2)`` the
    column shift (``encoding_dim = 2 * floor(D_p / 2)``). The position score of
    head h is ``v_h^T r_delta``; it depends on the shift only.

    Args:
        num_heads: int, number of attention heads.
        embedding_dim: int >= 2, ``D_p``.
        max_position: int or None. Largest grid side the tables cover
            (``2 * max_position - 1`` shifts per axis). None sizes them to the
            grid the layer is built on.
        embeddings_initializer: initializer of the shift tables and of ``v``.
        head_vectors: see `PositionScore`.

    Example:
    >>> score = LearnedRelativeScore(num_heads=9, embedding_dim=16)
    >>> score(keras.ops.zeros((2, 8, 8, 4))).shape
    (9, 64, 64)
    """

    separable = True

    def __init__(self, num_heads, embedding_dim, max_position=None,
                 embeddings_initializer=None, head_vectors=True, **kwargs):
        super().__init__(num_heads, head_vectors=head_vectors, **kwargs)
        check_positive_int("embedding_dim", embedding_dim)
        if embedding_dim < 2:
            raise ValueError(f"`embedding_dim` must be >= 2. Received: embedding_dim={embedding_dim}")
        if max_position is not None:
            check_positive_int("max_position", max_position)
        self.embedding_dim = int(embedding_dim)
        self.max_position = None if max_position is None else int(max_position)
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer or keras.initializers.RandomNormal(stddev=0.02)
        )
        self.axis_dim = self.embedding_dim // 2
        self.encoding_dim = 2 * self.axis_dim

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

        def table(name, size, dim):
            return self.add_weight(name=name, shape=(size, dim), dtype="float32", autocast=False,
                                   initializer=self.embeddings_initializer)

        self.row_embeddings = table("row_embeddings", 2 * self.row_size - 1, self.axis_dim)
        self.col_embeddings = table("col_embeddings", 2 * self.col_size - 1, self.axis_dim)
        if self.head_vectors:
            self.row_head_vectors = table("row_head_vectors", self.num_heads, self.axis_dim)
            self.col_head_vectors = table("col_head_vectors", self.num_heads, self.axis_dim)

    def _axis_tables(self, height, width):
        """Embeddings of every (query, key) shift per axis: (H, H, d) and (W, W, d)."""
        if height > self.row_size or width > self.col_size:
            raise ValueError(
                f"The grid {height}x{width} exceeds the relative tables built for "
                f"{self.row_size}x{self.col_size}."
            )
        row_index = (axis_shifts(height) + self.row_size - 1).astype("int32")
        col_index = (axis_shifts(width) + self.col_size - 1).astype("int32")
        return (ops.take(self.row_embeddings, row_index, axis=0),
                ops.take(self.col_embeddings, col_index, axis=0))

    def axis_scores(self, height, width):
        self._require_head_vectors()
        rows, cols = self._axis_tables(height, width)
        return (ops.einsum("ikd,hd->hik", rows, self.row_head_vectors),
                ops.einsum("jld,hd->hjl", cols, self.col_head_vectors))

    def relative_encoding(self, height, width):
        rows, cols = self._axis_tables(height, width)
        zeros_r = ops.zeros_like(rows)
        zeros_c = ops.zeros_like(cols)
        return _flat_encoding(ops.concatenate([rows, zeros_r], axis=-1),
                              ops.concatenate([zeros_c, cols], axis=-1))

    def content_position_scores(self, queries, height, width):
        # Factorised form: q.r_delta = q_row.row_emb[d1] + q_col.col_emb[d2], never
        # materialising the (H*W, H*W, D_p) encoding.
        rows, cols = self._axis_tables(height, width)
        batch = ops.shape(queries)[0]
        heads = queries.shape[2]
        grid = ops.reshape(queries, (batch, height, width, heads, self.encoding_dim))
        row_scores = ops.einsum("bijhd,ikd->bhijk", grid[..., : self.axis_dim], rows)
        col_scores = ops.einsum("bijhd,jld->bhijl", grid[..., self.axis_dim:], cols)
        total = row_scores[..., :, None] + col_scores[..., None, :]  # (b, h, i, j, k, l)
        return ops.reshape(total, (batch, heads, height * width, height * width))

    def get_config(self):
        config = super().get_config()
        config.update({
            "embedding_dim": self.embedding_dim,
            "max_position": self.max_position,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
        })
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SirenScore(PositionScore):
    """SIREN relative encoding (follow-up work): an MLP with sine activations of the normalised shift.

    Each shift ``delta`` is normalised per axis to ``delta / (size - 1)`` in
    [-1, 1] and fed to a small per-layer SIREN (Sitzmann et al., 2020)::

        z_1 = sin(omega_0 (u W_1 + b_1)),  z_{k+1} = sin(omega_0 (z_k W_k + b_k)),  score_h = z_L . v_h

    with SIREN's initialisation: ``W_1 ~ U(-1/2, 1/2)`` (1 / fan-in), later
    ``W_k, v ~ U(-sqrt(6/n)/omega_0, sqrt(6/n)/omega_0)``, biases
    ``U(-1/sqrt(n), 1/sqrt(n))``. ``r_delta`` is the last hidden layer ``z_L``
    (``encoding_dim = hidden_units``). Since inputs are normalised, the same
    weights apply to any image size. The MLP runs once per call on the
    ``(2H - 1)(2W - 1)`` distinct shifts.

    Args:
        num_heads: int, number of attention heads.
        hidden_units: int, width of the SIREN.
        num_hidden_layers: int >= 1, sine layers.
        omega_0: float > 0, the SIREN frequency (30 in the SIREN paper).
        head_vectors: see `PositionScore`.

    Example:
    >>> score = SirenScore(num_heads=9)
    >>> score(keras.ops.zeros((1, 8, 8, 4))).shape
    (9, 64, 64)
    """

    def __init__(self, num_heads, hidden_units=32, num_hidden_layers=2, omega_0=30.0, head_vectors=True,
                 **kwargs):
        super().__init__(num_heads, head_vectors=head_vectors, **kwargs)
        check_positive_int("hidden_units", hidden_units)
        check_positive_int("num_hidden_layers", num_hidden_layers)
        if not omega_0 > 0:
            raise ValueError(f"`omega_0` must be > 0. Received: omega_0={omega_0}")
        self.hidden_units = int(hidden_units)
        self.num_hidden_layers = int(num_hidden_layers)
        self.omega_0 = float(omega_0)
        self.encoding_dim = self.hidden_units

    def build(self, input_shape):
        super().build(input_shape)

        def uniform(name, shape, limit):
            return self.add_weight(name=name, shape=shape, dtype="float32", autocast=False,
                                   initializer=keras.initializers.RandomUniform(-limit, limit))

        width = self.hidden_units
        hidden_limit = (6.0 / width) ** 0.5 / self.omega_0
        self.sine_kernels = [uniform("sine_kernel_0", (2, width), 1.0 / 2)]
        self.sine_biases = [uniform("sine_bias_0", (width,), 2.0**-0.5)]
        for index in range(1, self.num_hidden_layers):
            self.sine_kernels.append(uniform(f"sine_kernel_{index}", (width, width), hidden_limit))
            self.sine_biases.append(uniform(f"sine_bias_{index}", (width,), width**-0.5))
        if self.head_vectors:
            self.head_kernel = uniform("head_kernel", (width, self.num_heads), hidden_limit)

    def shift_features(self, height, width):
        """``z_L`` for every distinct shift: (2H - 1, 2W - 1, hidden_units), float32."""
        rows = np.arange(-(height - 1), height, dtype="float32") / max(height - 1, 1)
        cols = np.arange(-(width - 1), width, dtype="float32") / max(width - 1, 1)
        grid = np.stack(np.meshgrid(rows, cols, indexing="ij"), axis=-1)
        features = ops.convert_to_tensor(grid)
        for kernel, bias in zip(self.sine_kernels, self.sine_biases):
            features = ops.sin(self.omega_0 * (ops.matmul(features, kernel) + bias))
        return features

    def _per_pair(self, table, height, width):
        """(2H-1, 2W-1, d) indexed by shift -> (H*W, H*W, d) indexed by (query, key)."""
        rows, cols = np.divmod(np.arange(height * width), width)
        index = ((rows[None, :] - rows[:, None] + height - 1) * (2 * width - 1)
                 + cols[None, :] - cols[:, None] + width - 1)
        flat = ops.reshape(table, (-1, table.shape[-1]))
        return ops.take(flat, index.astype("int32"), axis=0)

    def position_scores(self, height, width):
        self._require_head_vectors()
        table = ops.matmul(self.shift_features(height, width), self.head_kernel)  # (2H-1, 2W-1, heads)
        return ops.transpose(self._per_pair(table, height, width), (2, 0, 1))

    def relative_encoding(self, height, width):
        return self._per_pair(self.shift_features(height, width), height, width)

    def get_config(self):
        config = super().get_config()
        config.update({"hidden_units": self.hidden_units, "num_hidden_layers": self.num_hidden_layers,
                       "omega_0": self.omega_0})
        return config


POSITION_SCORES = {
    "quadratic": QuadraticScore,
    "gaussian": GaussianScore,
    "learned": LearnedRelativeScore,
    "siren": SirenScore,
}


def get_position_score(identifier, num_heads, **kwargs):
    """Returns a position score layer from a name, a config dict or an instance.

    Args:
        identifier: ``"quadratic"``, ``"gaussian"``, ``"learned"``, a
            `PositionScore` instance (returned as is) or a serialized layer dict.
        num_heads: int, used when building from a name.
        **kwargs: extra constructor arguments when building from a name.
    """
    if isinstance(identifier, PositionScore):
        return identifier
    if isinstance(identifier, dict):
        layer = keras.saving.deserialize_keras_object(identifier)
        if not isinstance(layer, PositionScore):
            raise ValueError(f"`position_score` config does not describe a PositionScore. Received: {identifier}")
        return layer
    if isinstance(identifier, str):
        if identifier not in POSITION_SCORES:
            suggestions = closest_names(identifier, POSITION_SCORES)
            hint = f" Did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
            raise ValueError(
                f"Unknown position score {identifier!r}; available: {sorted(POSITION_SCORES)}.{hint} "
                f"Received: position_score={identifier!r}"
            )
        return POSITION_SCORES[identifier](num_heads=num_heads, **kwargs)
    raise ValueError(
        "`position_score` must be a name, a PositionScore layer or its config. "
        f"Received: position_score={identifier!r}"
    )
