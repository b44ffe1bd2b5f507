"""A SIREN relative encoding (follow-up work): a sine MLP of the normalised shift."""

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers.position_score import PositionScore
from keras_attnconv.layers.shift_geometry import pixel_shifts
from keras_attnconv.utils.checks import check_positive_int, check_positive_number


@keras.saving.register_keras_serializable(package="keras_attnconv")
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
    >>> keras.ops.shape(score(keras.ops.zeros((1, 8, 8, 4))))
    (9, 64, 64)
    """

    def __init__(self, num_heads, hidden_units=32, num_hidden_layers=2, omega_0=30.0, head_vectors=True, **kwargs):
        super().__init__(num_heads, head_vectors=head_vectors, **kwargs)
        check_positive_int("hidden_units", hidden_units)
        check_positive_int("num_hidden_layers", num_hidden_layers)
        check_positive_number("omega_0", omega_0)
        self.hidden_units = int(hidden_units)
        self.num_hidden_layers = int(num_hidden_layers)
        self.omega_0 = float(omega_0)
        self.encoding_dim = self.hidden_units

    def build(self, input_shape):
        super().build(input_shape)

        def uniform(name, shape, limit):
            return self._add_float32_weight(name, shape, keras.initializers.RandomUniform(-limit, limit))

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
        row_shifts, col_shifts = pixel_shifts(height, width)
        index = (row_shifts + height - 1) * (2 * width - 1) + col_shifts + width - 1
        flat = ops.reshape(table, (-1, table.shape[-1]))
        return ops.take(flat, index.astype("int32"), axis=0)

    def position_scores(self, height, width):
        self._require_head_vectors()
        table = ops.matmul(self.shift_features(height, width), self.head_kernel)  # (2H-1, 2W-1, heads)
        return ops.transpose(self._per_pair(table, height, width), (2, 0, 1))

    def shift_scores(self, height, width):
        self._require_head_vectors()
        table = ops.matmul(self.shift_features(height, width), self.head_kernel)
        return ops.transpose(table, (2, 0, 1))

    def shift_encoding(self, height, width):
        return self.shift_features(height, width)

    def relative_encoding(self, height, width):
        return self._per_pair(self.shift_features(height, width), height, width)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"hidden_units": self.hidden_units, "num_hidden_layers": self.num_hidden_layers, "omega_0": self.omega_0}
        )
        return config
