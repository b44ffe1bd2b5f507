"""BERT-style (post-LayerNorm) Transformer encoder block over image pixels."""

import math

import keras
from keras import ops

from keras_attnconv.layers.dropout import Dropout
from keras_attnconv.layers.fan_in_uniform import initializer_for
from keras_attnconv.layers.relative_attention import RelativeMultiHeadAttention
from keras_attnconv.layers.validation import get_activation, get_initializer, real_inputs
from keras_attnconv.utils.checks import check_bool, check_positive_int, check_positive_number, check_rate


@keras.saving.register_keras_serializable(package="keras_attnconv")
class TransformerEncoderBlock(keras.layers.Layer):
    """One encoder block of the paper's network (BERT layout, post-LN)::

        x = LayerNorm(x + Dropout(Dense(hidden)(MHSA(x))))
        x = LayerNorm(x + Dropout(Dense(hidden)(GELU(Dense(intermediate)(x)))))

    Args:
        num_heads: int, attention heads.
        intermediate_dim: int, width of the feed-forward layer.
        position_score: position score of the attention (see
            `RelativeMultiHeadAttention`).
        attention_options: dict of further `RelativeMultiHeadAttention`
            arguments (``use_content_content``, ``key_dim``, ...).
        dropout: float, dropout after the attention and the feed-forward layer.
        attention_dropout: float, dropout on attention probabilities.
        layer_norm_epsilon: float, LayerNorm epsilon (paper: 1e-12).
        activation: feed-forward activation (default exact, erf-based GELU).
        kernel_initializer: initializer of all kernels.
        bias_initializer: initializer of all biases (of the attention too, unless
            `attention_options` sets one). A `FanInUniform` bounds each kernel
            and bias by its own fan-in, as PyTorch's linear layers.
        rematerialize: bool, recompute the feed-forward layer's activations
            (the (batch, H, W, intermediate_dim) tensors around the
            activation) in the backward pass instead of keeping them
            (`keras.remat`), and the attention's per-head tensors on its
            windowed path (its own ``rematerialize``, unless
            ``attention_options`` sets it). Saves memory for about one more
            forward pass of the feed-forward layer; dropout stays outside the
            recomputed part, so its mask is not redrawn.

    Call arguments:
        inputs: tensor (batch, H, W, hidden); integer inputs are cast to the
            compute dtype.
        training: bool, whether dropout is active.
        return_attention_scores: bool, also return the attention probabilities.

    Returns:
        Tensor (batch, H, W, hidden), or ``(output, probabilities)``.

    Example:
    >>> block = TransformerEncoderBlock(num_heads=4, intermediate_dim=32)
    >>> keras.ops.shape(block(keras.ops.ones((2, 8, 8, 16))))
    (2, 8, 8, 16)
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        position_score="quadratic",
        attention_options=None,
        dropout=0.1,
        attention_dropout=0.1,
        layer_norm_epsilon=1e-12,
        activation="gelu",
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        rematerialize=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("intermediate_dim", intermediate_dim)
        check_bool("rematerialize", rematerialize)
        check_rate("dropout", dropout)
        check_rate("attention_dropout", attention_dropout)
        check_positive_number("layer_norm_epsilon", layer_norm_epsilon)
        if attention_options is not None and not isinstance(attention_options, dict):
            raise ValueError(
                "`attention_options` must be None or a dict of RelativeMultiHeadAttention arguments. "
                f"Received: attention_options={attention_options!r}"
            )
        self.num_heads = num_heads
        self.intermediate_dim = int(intermediate_dim)
        self.attention_options = dict(attention_options or {})
        self.dropout = float(dropout)
        self.attention_dropout = float(attention_dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.activation = get_activation("activation", activation)
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        self.rematerialize = rematerialize
        self.attention = RelativeMultiHeadAttention(
            num_heads=num_heads,
            position_score=position_score,
            dropout=attention_dropout,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="attention",
            **{"rematerialize": rematerialize, "bias_initializer": self.bias_initializer, **self.attention_options},
        )

    def build(self, input_shape):
        hidden = input_shape[-1]
        if hidden is None:
            raise ValueError(f"The channel dimension must be known. Received: input_shape={tuple(input_shape)}")
        self.input_spec = keras.InputSpec(ndim=4, axes={-1: hidden})

        def dense(units, name, inputs, activation=None):
            return keras.layers.Dense(
                units,
                activation=activation,
                kernel_initializer=initializer_for(self.kernel_initializer, inputs),
                bias_initializer=initializer_for(self.bias_initializer, inputs),
                dtype=self.dtype_policy,
                name=name,
            )

        def norm(name):
            return keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)

        self.attention_dense = dense(hidden, "attention_dense", hidden)
        self.attention_norm = norm("attention_norm")
        self.intermediate_dense = dense(self.intermediate_dim, "intermediate_dense", hidden, _portable(self.activation))
        self.output_dense = dense(hidden, "output_dense", self.intermediate_dim)
        self.output_norm = norm("output_norm")
        self.dropout_layer = Dropout(self.dropout, dtype=self.dtype_policy)

        self.attention.build(input_shape)
        self.attention_dense.build(input_shape)
        self.attention_norm.build(input_shape)
        self.intermediate_dense.build(input_shape)
        self.output_dense.build((*tuple(input_shape)[:-1], self.intermediate_dim))
        self.output_norm.build(input_shape)

    def call(self, inputs, training=None, return_attention_scores=False):
        inputs = real_inputs(inputs, self.compute_dtype)  # integer inputs too, not only floating ones
        attended = self.attention(inputs, training=training, return_attention_scores=return_attention_scores)
        if return_attention_scores:
            attended, probabilities = attended
        residual = self.dropout_layer(self.attention_dense(attended), training=training)
        x = self.attention_norm(inputs + residual)
        feed_forward = (keras.remat(self._feed_forward) if self.rematerialize else self._feed_forward)(x)
        x = self.output_norm(x + self.dropout_layer(feed_forward, training=training))
        return (x, probabilities) if return_attention_scores else x

    def _feed_forward(self, x):
        return self.output_dense(self.intermediate_dense(x))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return outputs
        return outputs, self.attention.compute_output_spec(inputs, return_attention_scores=True)[1]

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "position_score": self.attention.get_config()["position_score"],
            "attention_options": self.attention_options,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "activation": keras.activations.serialize(self.activation),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "rematerialize": self.rematerialize,
        }


def _exact_gelu(x):
    return 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))


def _portable(activation):
    """`activation`, with Keras' exact GELU computed through erf.

    TensorFlow writes exact GELU as ``x/2 erfc(-x/sqrt(2))``, and ONNX has no
    Erfc operator: such a model converts to an ONNX file that onnxruntime
    refuses. ``x/2 (1 + erf(x/sqrt(2)))`` is the same function (JAX computes it
    this way) and every runtime has Erf.
    """
    return _exact_gelu if activation is keras.activations.gelu else activation


def encoder_blocks(model):
    """The `TransformerEncoderBlock` layers of a model, in order; ValueError if it has none."""
    blocks = [layer for layer in model.layers if isinstance(layer, TransformerEncoderBlock)]
    if not blocks:
        raise ValueError(
            f"`model` must have attention layers (TransformerEncoderBlock): {type(model).__name__} {model.name!r} "
            f"has none. Received: model={model.name!r}"
        )
    return blocks
