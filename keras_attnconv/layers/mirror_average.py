"""The second half of test-time flips: at inference, the mean of the outputs of each image and its mirror image."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_attnconv")
class MirrorAverage(keras.layers.Layer):
    """At inference, the mean of the two halves of a batch that `MirroredBatch` doubled; in training, the inputs.

    The outputs of a batch's images come first, those of their mirror images
    second (`MirroredBatch`); the mean of the logits is the logits of the
    test-time flips, so a model's output keeps its meaning (and its loss, its
    `from_logits=True`). Computed in float32 unless a `dtype` is given.

    Call arguments:
        inputs: tensor (2 * batch, ...) at inference, (batch, ...) in training.
        training: whether the call is a training step (False, the default,
            at inference).

    Returns:
        (batch, ...): at inference ``(inputs[:batch] + inputs[batch:]) / 2``;
        in training, `inputs`.

    Example:
    >>> logits = np.array([[1.0, 3.0], [3.0, 5.0]], "float32")  # an image's, then its mirror image's
    >>> keras.ops.convert_to_numpy(MirrorAverage()(logits))
    array([[2., 4.]], dtype=float32)
    """

    def __init__(self, **kwargs):
        kwargs.setdefault("dtype", "float32")  # the logits' dtype under any policy
        super().__init__(**kwargs)

    def call(self, inputs, training=False):
        if training:
            return inputs
        pairs = ops.reshape(inputs, (2, -1, *inputs.shape[1:]))  # -1: the batch, unknown in a traced graph
        return ops.mean(pairs, axis=0)

    def compute_output_spec(self, inputs, training=False):
        # The inference shape, which a model's graph is built with (the batch is unknown there: None).
        batch = inputs.shape[0]
        shape = inputs.shape if training else (None if batch is None else batch // 2, *inputs.shape[1:])
        return keras.KerasTensor(shape, dtype=self.compute_dtype)
