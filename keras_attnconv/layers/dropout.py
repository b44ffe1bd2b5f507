"""`keras.layers.Dropout` whose masks are cheap on a CPU (TensorFlow backend).

Keras draws a dropout mask on TensorFlow with the default stateless generator,
Philox, one 32-bit number per entry whatever the dtype. On a CPU this layer
draws its masks itself:

- Traced for XLA: with ThreeFry. XLA's CPU backend compiles Philox into 64-bit
  multiplications that do not vectorise; ThreeFry, the generator JAX uses, is
  32-bit additions, rotations and xors, which vectorise: the masks take about a
  third of the time (`attnconv bench --suite profile` measured both:
  `docs/performance.md`, "Where the step's time goes"). TensorFlow's ThreeFry
  kernel exists only in XLA (the graph's CPU kernel refuses it).
- Otherwise (TensorFlow's graph, the path `jit_compile="auto"` takes on a CPU,
  and eager, so that a step run eagerly draws what its graph draws): with
  Philox, two 16-bit draws from each 32-bit number, half of Keras' random
  numbers. The mixed_bfloat16 quadratic step took about 5% less time
  (`docs/performance.md`, "Dropout's masks from 16-bit draws").

Elsewhere (a GPU, JAX, whose masks are ThreeFry already) it is Keras' layer.
Same rate, same scaling by the inverse of the share kept, same seed stream (its
`SeedGenerator` state is what a resumed run restores): only the random bits
differ from Keras' layer, and with 16-bit draws the rate is rounded to a
multiple of 2**-16 (`sixteen_bit_dropout`).
"""

import keras

from keras_attnconv.layers.path_rule import default_platform

SIXTEEN_BITS = 1 << 16


def draws_own_masks():
    """Whether this layer draws its masks itself here rather than as Keras does: TensorFlow on a CPU."""
    return keras.backend.backend() == "tensorflow" and default_platform() == "cpu"


def _traced_for_xla():
    """Whether this call is being traced by TensorFlow for an XLA-compiled function."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util  # TensorFlow's own test for an XLA context

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


@keras.saving.register_keras_serializable(package="keras_attnconv")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout`, drawing its masks with ThreeFry under XLA on a CPU and with 16-bit Philox draws
    elsewhere on a CPU (TensorFlow; see the module)."""

    def call(self, inputs, training=False):
        # Rate 1 is Keras' zeros (TensorFlow's stateless dropout refuses it).
        if training and 0 < self.rate < 1 and draws_own_masks():
            draw = threefry_dropout if _traced_for_xla() else sixteen_bit_dropout
            return draw(inputs, self.rate, self.noise_shape, self.seed_generator.next())
        return super().call(inputs, training=training)


def _int32_seed(seed):
    """Keras' int64 seed stream as TensorFlow's int32 stateless seed, folded as Keras folds it."""
    import tensorflow as tf

    return tf.cast(tf.math.floormod(seed, tf.int32.max - 1), "int32")


def _concrete_noise_shape(inputs, noise_shape):
    """`noise_shape` with each None replaced by the size of that axis of `inputs` (the whole shape if None)."""
    import tensorflow as tf

    if noise_shape is None:
        return tf.shape(inputs)
    return [tf.shape(inputs)[axis] if size is None else size for axis, size in enumerate(noise_shape)]


def threefry_dropout(inputs, rate, noise_shape, seed):
    """TensorFlow's stateless dropout with ThreeFry bits, the seed folded into int32 as Keras does."""
    import tensorflow as tf

    noise_shape = None if noise_shape is None else _concrete_noise_shape(inputs, noise_shape)
    return tf.nn.experimental.stateless_dropout(
        inputs, rate=rate, seed=_int32_seed(seed), noise_shape=noise_shape, rng_alg="threefry"
    )


def sixteen_bit_threshold(rate):
    """The 16-bit draws below which an entry is dropped: ``rate * 2**16`` rounded, at least 1 and at most
    ``2**16 - 1``, so that a rate in (0, 1) drops something and keeps something (a scale of the kept entries
    stays finite, and so does its gradient)."""
    return min(max(round(rate * SIXTEEN_BITS), 1), SIXTEEN_BITS - 1)


def sixteen_bit_dropout(inputs, rate, noise_shape, seed):
    """Dropout whose draws are 16 bits, two from each 32-bit number of Philox (TensorFlow's stateless default).

    An entry is dropped where its draw is below `sixteen_bit_threshold`, so the rate is rounded to a
    multiple of 2**-16 (0.1 drops 6,554 draws in 65,536, 0.1000061); the kept entries are scaled by
    the inverse of the share kept, ``2**16 / (2**16 - threshold)``, which keeps the expectation exact
    and is ``1 / (1 - rate)`` where the rate is such a multiple (0.5, 0.25).
    """
    import tensorflow as tf

    shape = _concrete_noise_shape(inputs, noise_shape)
    count = tf.reduce_prod(shape)
    words = tf.random.stateless_uniform(
        [(count + 1) // 2], seed=_int32_seed(seed), minval=None, maxval=None, dtype=tf.uint32
    )
    draws = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:count]  # an odd count leaves one half unused
    threshold = sixteen_bit_threshold(rate)
    keep = tf.reshape(draws >= tf.constant(threshold, tf.uint16), shape)
    scale = tf.cast(SIXTEEN_BITS / (SIXTEEN_BITS - threshold), inputs.dtype)
    return tf.where(keep, inputs * scale, tf.zeros((), inputs.dtype))
