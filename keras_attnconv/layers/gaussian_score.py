"""Appendix E generalised quadratic encoding: anisotropic Gaussian heads, full or axis-aligned."""

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.position_score import PAPER_CENTER_STDDEV, PositionScore
from keras_attnconv.layers.shift_geometry import centered_shifts, combine_axis_scores, pixel_shifts, shift_grid
from keras_attnconv.utils.checks import check_real


class _GaussianScoreBase(PositionScore):
    """What `GaussianScore` and `DiagonalGaussianScore` share: centers, ``r_delta``, covariances.

    Subclasses create ``S_h = Sigma_h^{-1/2}`` (`_add_inverse_sqrt`) and compute
    ``Sigma_h^{-1} = S_h S_h^T`` from it (`inverse_covariance`).
    """

    encoding_dim = 5

    def __init__(
        self, num_heads, center_stddev=PAPER_CENTER_STDDEV, sigma_init_stddev=0.01, head_vectors=True, **kwargs
    ):
        super().__init__(num_heads, head_vectors=head_vectors, **kwargs)
        check_real("center_stddev", center_stddev, low=0.0)
        check_real("sigma_init_stddev", sigma_init_stddev, low=0.0)
        self.center_stddev = float(center_stddev)
        self.sigma_init_stddev = float(sigma_init_stddev)

    def build(self, input_shape):
        super().build(input_shape)
        if self.head_vectors:
            self.centers = self._add_float32_weight(
                "centers", (self.num_heads, 2), keras.initializers.RandomNormal(stddev=self.center_stddev)
            )
            self._add_inverse_sqrt(keras.initializers.RandomNormal(stddev=self.sigma_init_stddev))

    def _add_inverse_sqrt(self, noise):
        """Creates the weights of ``S_h``, initialised to the identity plus `noise`."""
        raise NotImplementedError

    def inverse_covariance(self):
        """``Sigma_h^{-1} = S_h S_h^T`` as a tensor (heads, 2, 2)."""
        raise NotImplementedError

    @property
    def covariances(self):
        """``Sigma_h`` as NumPy (heads, 2, 2); inf/huge for degenerate heads."""
        inverse = ops.convert_to_numpy(self.inverse_covariance()).astype("float64")
        return np.linalg.pinv(inverse)

    def relative_encoding(self, height, width):
        d1, d2 = (shift.astype("float32") for shift in pixel_shifts(height, width))
        return ops.convert_to_tensor(np.stack([d1, d2, d1**2, d2**2, d1 * d2], axis=-1))

    def shift_encoding(self, height, width):
        d1, d2 = shift_grid(height, width)
        return ops.convert_to_tensor(np.stack([d1, d2, d1**2, d2**2, d1 * d2], axis=-1))

    def get_config(self):
        config = super().get_config()
        config.update({"center_stddev": self.center_stddev, "sigma_init_stddev": self.sigma_init_stddev})
        return config


@keras.saving.register_keras_serializable(package="keras_attnconv")
class GaussianScore(_GaussianScoreBase):
    """Appendix E generalised quadratic encoding: one full-covariance Gaussian per head.

    ``score = -1/2 (delta - Delta_h)^T Sigma_h^{-1} (delta - Delta_h)`` with
    ``Sigma_h^{-1} = S_h S_h^T`` and ``S_h = Sigma_h^{-1/2}`` learned (so the
    inverse covariance stays positive semi-definite), initialised to
    ``I + N(0, sigma_init_stddev^2)``. In eq. (8) form
    ``r_delta = (delta_1, delta_2, delta_1^2, delta_2^2, delta_1 delta_2)``.
    With ``S_h = sqrt(2 alpha) I`` it equals `QuadraticScore`. The cross term
    makes the scores not separable by axis; `DiagonalGaussianScore` is the
    axis-aligned (separable) variant.

    Args:
        num_heads: int, number of attention heads.
        center_stddev: float, std of the initial centers (paper: sqrt(2)).
        sigma_init_stddev: float, std of the noise added to the identity
            ``Sigma^{-1/2}`` at initialisation (paper: 0.01).
        head_vectors: see `PositionScore`.

    Example:
    >>> score = GaussianScore(num_heads=9)
    >>> keras.ops.shape(score(keras.ops.zeros((1, 8, 8, 4))))
    (9, 64, 64)
    """

    center_and_spread_weights = ("centers", "inverse_sqrt_covariance")

    @classmethod
    def from_arguments(cls, num_heads, key_dim=None, diagonal=False, **kwargs):
        # ``get_position_score("gaussian", heads, diagonal=True)`` names the axis-aligned score, as it always has.
        return (DiagonalGaussianScore if diagonal else cls)(num_heads, **kwargs)

    @classmethod
    def from_config(cls, config):
        # Configs saved before DiagonalGaussianScore existed say GaussianScore with "diagonal": true.
        config = dict(config)
        if config.pop("diagonal", False):
            return DiagonalGaussianScore.from_config(config)
        return super().from_config(config)

    def _add_inverse_sqrt(self, noise):
        identity = np.tile(np.eye(2, dtype="float32"), (self.num_heads, 1, 1))
        self.inverse_sqrt_covariance = self._add_float32_weight(
            "inverse_sqrt_covariance",
            (self.num_heads, 2, 2),
            lambda shape, dtype=None: ops.convert_to_tensor(identity) + noise(shape, dtype),
        )

    def inverse_covariance(self):
        self._require_head_vectors()
        sqrt = ops.convert_to_tensor(self.inverse_sqrt_covariance)
        return ops.einsum("hij,hkj->hik", sqrt, sqrt)

    def position_scores(self, height, width):
        inverse = self.inverse_covariance()
        row, col = centered_shifts(self.centers, height, width)  # (h, H, H), (h, W, W)
        a = inverse[:, 0, 0, None, None]
        b = inverse[:, 0, 1, None, None]
        c = inverse[:, 1, 1, None, None]
        separable = combine_axis_scores(-0.5 * a * ops.square(row), -0.5 * c * ops.square(col))
        # The cross term -b * row_shift * col_shift is a product, not a sum, of axis terms.
        heads = self.num_heads
        cross = -b[:, :, None, :, None] * row[:, :, None, :, None] * col[:, None, :, None, :]
        cross = ops.reshape(cross, (heads, height * width, height * width))
        return separable + cross

    def shift_scores(self, height, width):
        inverse = self.inverse_covariance()
        d1, d2 = shift_grid(height, width)
        centers = ops.convert_to_tensor(self.centers)
        z1 = ops.subtract(d1[None], centers[:, 0, None, None])  # NumPy less a tensor: `ops`, for PyTorch
        z2 = ops.subtract(d2[None], centers[:, 1, None, None])
        a, b, c = (inverse[:, i, j, None, None] for i, j in ((0, 0), (0, 1), (1, 1)))
        return -0.5 * (a * ops.square(z1) + c * ops.square(z2)) - b * z1 * z2


@keras.saving.register_keras_serializable(package="keras_attnconv")
class DiagonalGaussianScore(_GaussianScoreBase):
    """Axis-aligned Gaussian heads: `GaussianScore` with a diagonal ``Sigma_h^{-1/2} = diag(s_h)``.

    ``score = -1/2 sum_d s_hd^2 (delta_d - Delta_hd)^2``, a row term plus a
    column term, so the attention can apply a head as a row pass and a column
    pass (``attention_mode == "separable"``). ``s_h`` is initialised to
    ``1 + N(0, sigma_init_stddev^2)``.

    Args:
        num_heads: int, number of attention heads.
        center_stddev: float, std of the initial centers (paper: sqrt(2)).
        sigma_init_stddev: float, std of the noise added to ``s_h = 1`` at
            initialisation (paper: 0.01).
        head_vectors: see `PositionScore`.

    Example:
    >>> score = DiagonalGaussianScore(num_heads=9)
    >>> keras.ops.shape(score(keras.ops.zeros((1, 8, 8, 4))))
    (9, 64, 64)
    """

    separable = True
    peaks_in_closed_form = True
    center_and_spread_weights = ("centers", "inverse_sqrt_variances")

    def _add_inverse_sqrt(self, noise):
        self.inverse_sqrt_variances = self._add_float32_weight(
            "inverse_sqrt_variances", (self.num_heads, 2), lambda shape, dtype=None: 1.0 + noise(shape, dtype)
        )

    def _inverse_variances(self):
        """Diagonal of ``Sigma_h^{-1}``: (heads, 2)."""
        self._require_head_vectors()
        return ops.square(ops.convert_to_tensor(self.inverse_sqrt_variances))

    def inverse_covariance(self):
        return self._inverse_variances()[:, :, None] * ops.eye(2, dtype="float32")[None]

    def axis_square_weights(self):
        """``s_hd^2 / 2``, half the diagonal of ``Sigma_h^{-1}``, per axis."""
        halves = 0.5 * self._inverse_variances()
        return halves[:, 0], halves[:, 1]
