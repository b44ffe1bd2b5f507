"""The paper's quadratic encoding, eq. (9): isotropic Gaussian heads."""

import numbers

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.position_score import PAPER_CENTER_STDDEV, PositionScore
from keras_attnconv.layers.shift_geometry import axis_shifts, combine_axis_features, shift_grid
from keras_attnconv.layers.validation import get_initializer
from keras_attnconv.utils.checks import check_choice, check_positive_number, check_real


@keras.saving.register_keras_serializable(package="keras_attnconv")
class QuadraticScore(PositionScore):
    """Eq. (9) quadratic encoding: ``-alpha_h * ||delta - Delta_h||^2``.

    ``v_h = -alpha_h (1, -2 Delta_h1, -2 Delta_h2)`` and
    ``r_delta = (||delta||^2, delta_1, delta_2)``; ``v_h^T r_delta`` differs from
    ``-alpha_h ||delta - Delta_h||^2`` by a constant per query, which softmax
    ignores. Scores are computed in the centered form, which stays accurate for
    far centers and huge ``alpha`` (no cancellation of large terms). With
    ``alpha >= 46`` a head attends to the single pixel ``q + Delta_h`` in float32
    (Lemma 2).

    Args:
        num_heads: int, number of attention heads.
        center_stddev: float, standard deviation of the initial centers
            ``Delta_h ~ N(0, center_stddev^2 I)``; the paper's N(0, 2I) is the
            default.
        alpha_initializer: initializer of ``alpha`` (``width="alpha"``).
            Default 0.5, the isotropic Gaussian with unit covariance that the
            official code starts from.
        width: which weight holds each head's width. ``"alpha"``: ``alpha_h``
            itself. ``"spread"``: the official code's inverse standard
            deviation ``s_h``, with ``alpha_h = s_h^2 / 2``, initialised to
            ``1 + N(0, sigma_init_stddev^2)``. The forward pass is the same; a
            gradient step is not (one on ``s_h`` moves alpha by ``2 alpha_h``
            times the same step on ``alpha_h``, to first order).
        sigma_init_stddev: float >= 0, the noise of the initial spreads
            (``width="spread"``; the official 0.01).
        head_vectors: see `PositionScore`.

    Example:
    >>> score = QuadraticScore(num_heads=9)
    >>> keras.ops.shape(score(keras.ops.zeros((1, 16, 16, 32))))
    (9, 256, 256)
    """

    encoding_dim = 3
    separable = True
    peaks_in_closed_form = True
    center_and_spread_weights = ("centers", "alpha", "spreads")
    WIDTHS = ("alpha", "spread")

    def __init__(
        self,
        num_heads,
        center_stddev=PAPER_CENTER_STDDEV,
        alpha_initializer=0.5,
        head_vectors=True,
        width="alpha",
        sigma_init_stddev=0.01,
        **kwargs,
    ):
        super().__init__(num_heads, head_vectors=head_vectors, **kwargs)
        check_real("center_stddev", center_stddev, low=0.0)
        check_choice("width", width, self.WIDTHS)
        check_real("sigma_init_stddev", sigma_init_stddev, low=0.0)
        self.center_stddev = float(center_stddev)
        self.width = width
        self.sigma_init_stddev = float(sigma_init_stddev)
        if isinstance(alpha_initializer, numbers.Real) and not isinstance(alpha_initializer, bool):
            check_positive_number("alpha_initializer", alpha_initializer)  # a NaN would make every score NaN
            alpha_initializer = float(alpha_initializer)
        else:
            get_initializer("alpha_initializer", alpha_initializer)
        self.alpha_initializer = alpha_initializer
        if width == "spread" and alpha_initializer != 0.5:
            raise ValueError(
                "`alpha_initializer` applies to width='alpha'; with width='spread' the spreads start "
                "at 1 + N(0, sigma_init_stddev^2) (alpha about 0.5). Received: "
                f"alpha_initializer={alpha_initializer!r}, width='spread'"
            )

    def build(self, input_shape):
        super().build(input_shape)
        if self.head_vectors:
            self.centers = self._add_float32_weight(
                "centers", (self.num_heads, 2), keras.initializers.RandomNormal(stddev=self.center_stddev)
            )
            if self.width == "spread":
                noise = keras.initializers.RandomNormal(stddev=self.sigma_init_stddev)
                self.spreads = self._add_float32_weight(
                    "spreads", (self.num_heads,), lambda shape, dtype=None: 1.0 + noise(shape, dtype)
                )
            else:
                alpha_init = self.alpha_initializer
                if isinstance(alpha_init, float):
                    alpha_init = keras.initializers.Constant(alpha_init)
                self._alpha = self._add_float32_weight("alpha", (self.num_heads,), alpha_init)

    @property
    def alpha(self):
        """``alpha_h`` (heads,): the `alpha` weight, or ``spreads^2 / 2`` (``width="spread"``)."""
        if self.width == "spread":
            return ops.square(ops.convert_to_tensor(self.spreads)) / 2.0
        return self._alpha

    def set_alpha(self, alpha):
        """Sets every head's ``alpha_h`` (a (heads,) array of positive values), whichever weight holds it."""
        alpha = np.asarray(alpha, "float32")
        if self.width == "spread":
            self.spreads.assign(np.sqrt(2.0 * alpha))
        else:
            self._alpha.assign(alpha)

    @property
    def covariances(self):
        """Covariance ``I / (2 alpha_h)`` of each head's Gaussian, NumPy (heads, 2, 2).

        A head whose ``alpha_h`` trained to 0 attends uniformly: its variance is infinite (``inf`` on the diagonal).
        """
        alpha = ops.convert_to_numpy(self.alpha).astype("float64")
        with np.errstate(divide="ignore"):
            variance = 1.0 / (2.0 * alpha)
        covariances = np.zeros((len(alpha), 2, 2))
        covariances[:, 0, 0] = covariances[:, 1, 1] = variance
        return covariances

    def head_vectors_v(self):
        """The eq. (9) vectors ``v_h = -alpha_h (1, -2 Delta_h1, -2 Delta_h2)``: (heads, 3)."""
        self._require_head_vectors()
        alpha = ops.convert_to_tensor(self.alpha)[:, None]
        ones = ops.ones_like(alpha)
        return -alpha * ops.concatenate([ones, -2.0 * ops.convert_to_tensor(self.centers)], axis=-1)

    def axis_square_weights(self):
        """``alpha_h`` on both axes."""
        self._require_head_vectors()
        alpha = ops.convert_to_tensor(self.alpha)
        return alpha, alpha

    def relative_encoding(self, height, width):
        rows, cols = axis_shifts(height), axis_shifts(width)
        zeros_r, zeros_c = np.zeros_like(rows), np.zeros_like(cols)
        row_features = np.stack([rows**2, rows, zeros_r], axis=-1)
        col_features = np.stack([cols**2, zeros_c, cols], axis=-1)
        return combine_axis_features(ops.convert_to_tensor(row_features), ops.convert_to_tensor(col_features))

    def shift_encoding(self, height, width):
        d1, d2 = shift_grid(height, width)
        return ops.convert_to_tensor(np.stack([d1**2 + d2**2, d1, d2], axis=-1))

    def get_config(self):
        config = super().get_config()
        alpha_init = self.alpha_initializer
        if not isinstance(alpha_init, float):
            alpha_init = keras.initializers.serialize(keras.initializers.get(alpha_init))
        config.update({"center_stddev": self.center_stddev, "alpha_initializer": alpha_init})
        if self.width != "alpha":  # only when set: configs saved before the option stay as they were
            config.update({"width": self.width, "sigma_init_stddev": self.sigma_init_stddev})
        return config
