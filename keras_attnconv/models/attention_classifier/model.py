"""`AttentionClassifier`: the paper's fully attentional classifier, built from its `AttentionClassifierConfig`."""

import keras

from keras_attnconv.layers import (
    FanInUniform,
    GaussianScore,
    InvertibleDownsampling,
    LearnedRelativeScore,
    QuadraticScore,
    TransformerEncoderBlock,
)
from keras_attnconv.layers.fan_in_uniform import initializer_for
from keras_attnconv.layers.position_score import OFFICIAL_CENTER_STDDEV
from keras_attnconv.models.attention_classifier.config import ABSOLUTE_ENCODINGS, AttentionClassifierConfig
from keras_attnconv.models.image_classifier import ImageClassifier


def _position_score(config, num_heads, dtype):
    """The position score of one block (a fresh layer per block, never shared)."""
    official = config.initialization == "official"
    # The official code draws the centers from N(0, 2^2) per coordinate (gaussian_init_mu_std=2);
    # the paper's text says N(0, 2I).
    centers = {"center_stddev": OFFICIAL_CENTER_STDDEV} if official else {}
    if config.position_score == "quadratic" and (config.quadratic_width != "alpha" or official):
        return QuadraticScore(
            num_heads, width=config.quadratic_width, head_vectors=config.use_position_bias, dtype="float32", **centers
        )
    if config.position_score == "gaussian" and official:
        return GaussianScore(num_heads, head_vectors=config.use_position_bias, dtype="float32", **centers)
    if config.position_score != "learned":
        return config.position_score
    embedding_dim = config.position_embedding_dim or config.hidden_dim - config.hidden_dim % 2  # as the config checks
    if official:  # nn.Embedding's N(0, 1) tables; the heads' vectors are nn.Linear maps
        tables, vectors = keras.initializers.RandomNormal(stddev=1.0), FanInUniform()
    else:
        tables, vectors = keras.initializers.RandomNormal(stddev=config.initializer_range), None
    return LearnedRelativeScore(
        num_heads,
        embedding_dim=embedding_dim,
        head_vectors=config.use_position_bias,
        embeddings_initializer=tables,
        head_vectors_initializer=vectors,
        dtype=dtype,
    )


@keras.saving.register_keras_serializable(package="keras_attnconv")
class AttentionClassifier(ImageClassifier):
    """The paper's fully attentional classifier (section 4; Table 2 by default).

    Its constructor arguments are the fields of `AttentionClassifierConfig`
    (which checks them) and those of `ImageClassifier` (``dtype``, ``name``);
    `get_config` returns them, so a ``.keras`` file reloads as this class.

    Example:
    >>> model = AttentionClassifier(num_layers=2, hidden_dim=48, intermediate_dim=96, name="mine")
    >>> keras.ops.shape(model(np.zeros((1, 32, 32, 3), "uint8")))
    (1, 10)
    """

    config_class = AttentionClassifierConfig
    default_name = "attention_classifier"

    @staticmethod
    def initializers(config):
        """``(kernel, bias)`` initializers of the model's linear maps (`AttentionClassifierConfig.initialization`)."""
        if config.initialization == "official":
            return FanInUniform(), FanInUniform()
        return keras.initializers.RandomNormal(stddev=config.initializer_range), keras.initializers.Zeros()

    @classmethod
    def head_initializers(cls, config):
        if config.initialization == "official":
            kernel, bias = cls.initializers(config)
            return {"kernel_initializer": kernel, "bias_initializer": initializer_for(bias, config.hidden_dim)}
        return {}

    @classmethod
    def features(cls, x, config, dtype):
        initializer, bias_initializer = cls.initializers(config)
        x = InvertibleDownsampling(config.downsampling, dtype=dtype, name="downsampling")(x)
        pixels = 3 * config.downsampling**2  # the inputs of the embedding
        x = keras.layers.Dense(
            config.hidden_dim,
            kernel_initializer=initializer_for(initializer, pixels),
            bias_initializer=initializer_for(bias_initializer, pixels),
            dtype=dtype,
            name="embedding",
        )(x)
        if config.absolute_encoding:
            encoding = ABSOLUTE_ENCODINGS[config.absolute_encoding](dtype=dtype, name="absolute_position")(x)
            x = keras.layers.Add(dtype=dtype, name="add_position")([x, encoding])
        attention_options = config.attention_arguments()
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
                bias_initializer=bias_initializer,
                rematerialize=config.rematerialize,
                dtype=dtype,
                name=f"encoder_{index}",
            )(x)
        return x


def with_attention_options(model, **options):
    """A copy of an `AttentionClassifier` (weights and dtype policy too) with `options` on every attention layer.

    E.g. ``with_attention_options(model, separable=False)`` forces the general
    eq. (8) path. The options go into the copy's config (``attention_options``),
    so it saves and reloads with them.
    """
    if not isinstance(model, AttentionClassifier):
        raise ValueError(f"`model` must be an AttentionClassifier. Received: model of class {type(model).__name__}")
    return model.with_config(attention_options={**(model.config.attention_options or {}), **options})
