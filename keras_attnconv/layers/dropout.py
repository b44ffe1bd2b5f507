"""`keras.layers.Dropout` whose masks are cheap in an XLA-compiled step on a CPU (TensorFlow backend).

Keras draws a dropout mask on TensorFlow with the default stateless generator.
Compiled by XLA for a CPU, that is Philox, expanded into 64-bit multiplications
that do not vectorise. ThreeFry, the generator JAX uses, is 32-bit additions,
rotations and xors, which vectorise: the masks take about a third of the time
(`attnconv bench --suite profile` measured both: `docs/performance.md`, "Where
the step's time goes").

TensorFlow's ThreeFry kernel exists only in XLA (the graph's CPU kernel refuses
it), so the layer draws with ThreeFry only when it is traced for XLA on a CPU,
and is Keras' layer everywhere else: eager, TensorFlow's graph, a GPU (not
measured there), and JAX, whose masks are ThreeFry already. Same rate, same
scaling by ``1 / (1 - rate)``, same seed stream (its `SeedGenerator` state is
what a resumed run restores): only the random bits differ from Keras' layer.
"""

import keras

from keras_attnconv.layers.path_rule import default_platform


def draws_threefry_under_xla():
    """Whether masks traced for XLA are drawn with ThreeFry by this layer here: TensorFlow on a CPU."""
    return keras.backend.backend() == "tensorflow" and default_platform() == "cpu"


def _traced_for_xla_on_a_cpu():
    """Whether this call is being traced by TensorFlow for an XLA-compiled function on a CPU."""
    if not draws_threefry_under_xla():
        return False
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util  # TensorFlow's own test for an XLA context

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


@keras.saving.register_keras_serializable(package="keras_attnconv")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout`, drawing its masks with ThreeFry when compiled by XLA on a CPU (see the module)."""

    def call(self, inputs, training=False):
        # Rate 1 is Keras' zeros (TensorFlow's stateless dropout refuses it).
        if training and 0 < self.rate < 1 and _traced_for_xla_on_a_cpu():
            return threefry_dropout(inputs, self.rate, self.noise_shape, self.seed_generator.next())
        return super().call(inputs, training=training)


def threefry_dropout(inputs, rate, noise_shape, seed):
    """TensorFlow's stateless dropout with ThreeFry bits, the seed folded into int32 as Keras does."""
    import tensorflow as tf

    seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), "int32")  # Keras' int64 stream as XLA's int32 seed
    if noise_shape is not None:
        noise_shape = [tf.shape(inputs)[axis] if size is None else size for axis, size in enumerate(noise_shape)]
    return tf.nn.experimental.stateless_dropout(
        inputs, rate=rate, seed=seed, noise_shape=noise_shape, rng_alg="threefry"
    )
