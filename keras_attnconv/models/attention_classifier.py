"""The paper's fully attentional image classifier, built from a config."""

import dataclasses

import keras

from keras_attnconv.layers import (
    AttentionSpan,
    InvertibleDownsampling,
    LearnedPositionEmbedding,
    LearnedRelativeScore,
    SinusoidalPositionEmbedding,
    TransformerEncoderBlock,
)
from keras_attnconv.layers.neighbourhood import check_window, dilation_pair, window_pair
from keras_attnconv.models.validation import check_config_fields, dtype_policy
from keras_attnconv.utils import check_bool, check_positive_int

ABSOLUTE_ENCODINGS = {"learned": LearnedPositionEmbedding, "sinusoid": SinusoidalPositionEmbedding}


@dataclasses.dataclass(frozen=True)
class AttentionClassifierConfig:
    """Hyper-parameters of the self-attention classifier (defaults: Table 2).

    Input ``image_size x image_size x 3`` -> ``InvertibleDownsampling(downsampling)``
    -> ``Dense(hidden_dim)`` -> ``num_layers`` encoder blocks -> global average
    pool -> ``Dense(num_classes)`` (float32 logits). `build` makes the model in
    any dtype policy (``config.build(dtype="mixed_bfloat16")``).

    Attributes:
        num_layers: encoder blocks.
        num_heads: heads per block, an int or one int per block (pruned models).
        hidden_dim: token width.
        intermediate_dim: feed-forward width.
        position_score: ``"quadratic"``, ``"gaussian"``, ``"learned"``, ``"siren"``,
            or None when no relative position term is used.
        position_embedding_dim: ``D_p`` of the learned encoding, a positive
            int; None means ``hidden_dim``.
        use_content_content, use_content_position, use_position_bias: the
            score terms of eq. (8) (see `RelativeMultiHeadAttention`).
        absolute_encoding: None, ``"learned"`` or ``"sinusoid"``: an absolute
            position encoding added to the tokens before the first block.
        attention_span: None, or a dict of `AttentionSpan` arguments
            (``{"initial_sigma": 4.0, "threshold": 0.1}``; ``{}`` for its
            defaults): a learned Gaussian span on every head's attention.
            With a ``max_window`` it runs on the windowed path.
        window: None (global attention), an odd int or a pair of them:
            every query attends to its ``window x window`` neighbourhood of
            keys (NATTEN's rule, see `RelativeMultiHeadAttention`), at
            ``O(T window^2)`` cost.
        dilation: int >= 1 or a pair, spacing of the window's keys.
        rematerialize: bool, recompute in the backward pass, instead of
            keeping them, every block's feed-forward activations and, with a
            window, the attention's per-head tensors (less memory for about
            one more forward pass of each; see `TransformerEncoderBlock`).
        dropout, attention_dropout: dropout rates.
        layer_norm_epsilon: LayerNorm epsilon.
        downsampling: block size of the invertible down-sampling.
        initializer_range: std (> 0) of the N(0, s^2) kernel initialisation (BERT's 0.02).
        num_classes: classes of the classifier.
        image_size: side of the square input image; a multiple of `downsampling`.
    """

    num_layers: int = 6
    num_heads: "int | tuple[int, ...]" = 9
    hidden_dim: int = 400
    intermediate_dim: int = 512
    position_score: "str | None" = "quadratic"
    position_embedding_dim: "int | None" = None
    use_content_content: bool = False
    use_content_position: bool = False
    use_position_bias: bool = True
    absolute_encoding: "str | None" = None
    attention_span: "dict | None" = None
    window: "int | tuple[int, int] | None" = None
    dilation: "int | tuple[int, int]" = 1
    rematerialize: bool = False
    dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_epsilon: float = 1e-12
    downsampling: int = 2
    initializer_range: float = 0.02
    num_classes: int = 10
    image_size: int = 32

    def __post_init__(self):
        for name in ("num_heads", "window", "dilation"):  # TOML and JSON give lists
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        check_config_fields(self, positive=("num_layers", "hidden_dim", "intermediate_dim", "downsampling",
                                            "image_size"),
                            rates=("dropout", "attention_dropout"), positive_numbers=("initializer_range",),
                            optional_positive=("position_embedding_dim",))
        if self.window is not None:  # the layer's own rules, checked before anything is built
            side = self.image_size // self.downsampling
            for window, dilation in zip(window_pair("window", self.window), dilation_pair(self.dilation)):
                check_window(window, dilation, side)
        elif self.dilation != 1:
            raise ValueError(f"`dilation` needs a `window`. Received: dilation={self.dilation!r}, window=None")
        check_bool("rematerialize", self.rematerialize)
        if isinstance(self.num_heads, tuple):
            if len(self.num_heads) != self.num_layers or any(
                    isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in self.num_heads):
                raise ValueError(
                    f"`num_heads` per layer must hold {self.num_layers} positive integers (one per layer). "
                    f"Received: num_heads={self.num_heads}"
                )
        else:
            check_positive_int("num_heads", self.num_heads)
        if self.image_size % self.downsampling:
            raise ValueError(
                f"`image_size` must be a multiple of the down-sampling block ({self.downsampling}). "
                f"Received: image_size={self.image_size}"
            )
        uses_positions = self.use_content_position or self.use_position_bias
        if not uses_positions and self.position_score is not None:
            raise ValueError("`position_score` must be None when no position term is used. "
                             f"Received: position_score={self.position_score!r}")
        if self.absolute_encoding not in (None, *ABSOLUTE_ENCODINGS):
            raise ValueError(f"`absolute_encoding` must be None, 'learned' or 'sinusoid'. "
                             f"Received: absolute_encoding={self.absolute_encoding!r}")
        if uses_positions and self.position_score not in ("quadratic", "gaussian", "learned", "siren"):
            raise ValueError(
                "`position_score` must be 'quadratic', 'gaussian', 'learned' or 'siren'. "
                f"Received: position_score={self.position_score!r}"
            )
        if self.attention_span is not None:
            if not isinstance(self.attention_span, dict):
                raise ValueError("`attention_span` must be None or a dict of AttentionSpan arguments. "
                                 f"Received: attention_span={self.attention_span!r}")
            try:
                AttentionSpan(1, **self.attention_span)
            except (TypeError, ValueError) as error:
                raise ValueError(f"Invalid `attention_span` {self.attention_span!r}: {error}") from None
        if not (self.use_content_content or self.use_content_position or self.use_position_bias):
            raise ValueError(
                "At least one of use_content_content, use_content_position, use_position_bias must be True."
            )

    @property
    def heads_per_layer(self):
        """Number of heads of each block, as a tuple."""
        if isinstance(self.num_heads, tuple):
            return self.num_heads
        return (self.num_heads,) * self.num_layers

    def build(self, name=None, dtype=None):
        return build_attention_classifier(self, name=name, dtype=dtype)


def _position_score(config, num_heads, dtype):
    """The position score of one block (a fresh layer per block, never shared)."""
    if config.position_score != "learned":
        return config.position_score
    return LearnedRelativeScore(
        num_heads,
        embedding_dim=config.hidden_dim if config.position_embedding_dim is None else config.position_embedding_dim,
        head_vectors=config.use_position_bias,
        embeddings_initializer=keras.initializers.RandomNormal(stddev=config.initializer_range),
        dtype=dtype,
    )


def build_attention_classifier(config, name=None, dtype=None):
    """Builds the functional Keras model described by `config` (logits output), every layer in `dtype`.

    `dtype` is a dtype policy as `build_model` takes it (None: Keras' global
    policy); the logits layer is float32 under any policy.
    """
    dtype = dtype_policy(dtype)
    initializer = keras.initializers.RandomNormal(stddev=config.initializer_range)
    inputs = keras.Input((config.image_size, config.image_size, 3), name="images")
    x = InvertibleDownsampling(config.downsampling, dtype=dtype, name="downsampling")(inputs)
    x = keras.layers.Dense(config.hidden_dim, kernel_initializer=initializer, dtype=dtype, name="embedding")(x)
    if config.absolute_encoding:
        encoding = ABSOLUTE_ENCODINGS[config.absolute_encoding](dtype=dtype, name="absolute_position")(x)
        x = keras.layers.Add(dtype=dtype, name="add_position")([x, encoding])
    attention_options = {
        "use_content_content": config.use_content_content,
        "use_content_position": config.use_content_position,
        "use_position_bias": config.use_position_bias,
        "key_dim": config.hidden_dim,
    }
    if config.attention_span is not None:
        attention_options["attention_span"] = dict(config.attention_span)
    if config.window is not None:  # only when set: configs saved before windows existed stay as they were
        attention_options.update(window=config.window, dilation=config.dilation)
    for index, num_heads in enumerate(config.heads_per_layer):
        x = TransformerEncoderBlock(
            num_heads=num_heads,
            intermediate_dim=config.intermediate_dim,
            position_score=_position_score(config, num_heads, dtype),
            attention_options=attention_options,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
            layer_norm_epsilon=config.layer_norm_epsilon,
            kernel_initializer=initializer,
            rematerialize=config.rematerialize,
            dtype=dtype,
            name=f"encoder_{index}",
        )(x)
    x = keras.layers.GlobalAveragePooling2D(dtype=dtype, name="pool")(x)
    # The logits stay float32 under any policy, so the softmax and the loss are computed in float32.
    outputs = keras.layers.Dense(config.num_classes, dtype="float32", name="logits")(x)
    model = keras.Model(inputs, outputs, name=name or "attention_classifier")
    model.dtype_policy = dtype  # as keras-hub's Backbone: `compile` reads it (loss scaling for mixed_float16)
    return model


def with_attention_options(model, **options):
    """A copy of an attention classifier (weights and dtype policy too) with `options` set on every attention layer.

    E.g. ``with_attention_options(model, separable=False)`` forces the general eq. (8) path.
    """
    config = model.get_config()
    for layer in config["layers"]:
        if layer["class_name"] == "TransformerEncoderBlock":
            layer["config"]["attention_options"].update(options)
    copy = keras.Model.from_config(config)
    copy.set_weights(model.get_weights())
    copy.dtype_policy = model.dtype_policy
    return copy

