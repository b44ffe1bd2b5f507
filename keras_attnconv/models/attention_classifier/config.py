"""`AttentionClassifierConfig`: the paper's attention classifier's hyper-parameters, validated once, when made."""

import dataclasses

from keras_attnconv.layers import (
    AttentionSpan,
    LearnedPositionEmbedding,
    QuadraticScore,
    RelativeMultiHeadAttention,
    SinusoidalPositionEmbedding,
)
from keras_attnconv.layers.neighbourhood import get_neighbourhood, window_arguments
from keras_attnconv.layers.position_score_factory import position_score_class
from keras_attnconv.models.image_classifier import ClassifierConfig
from keras_attnconv.models.validation import check_config_fields, check_sizes
from keras_attnconv.utils.checks import check_choice, check_positive_int, did_you_mean, plain_numbers

ABSOLUTE_ENCODINGS = {"learned": LearnedPositionEmbedding, "sinusoid": SinusoidalPositionEmbedding}
#: How the weights start (`AttentionClassifierConfig.initialization`).
INITIALIZATIONS = ("bert", "official")
#: `RelativeMultiHeadAttention` arguments that `attention_options` may set (the config's own fields set the others).
ATTENTION_OPTIONS = (
    "use_key_bias",
    "content_scale",
    "position_key_projection",
    "use_bias",
    "bias_initializer",
    "separable",
    "windowed",
)


@dataclasses.dataclass(frozen=True)
class AttentionClassifierConfig(ClassifierConfig):
    """Hyper-parameters of the self-attention classifier (defaults: Table 2).

    uint8 input ``image_size x image_size x 3`` -> `PixelNormalization` ->
    ``InvertibleDownsampling(downsampling)`` -> ``Dense(hidden_dim)`` ->
    ``num_layers`` encoder blocks -> global average pool ->
    ``Dense(num_classes)`` (float32 logits). `build` makes the
    `AttentionClassifier` in any dtype policy (``config.build(dtype="mixed_bfloat16")``).
    The fields of `ClassifierConfig` (``num_classes``, ``image_size``,
    ``class_names``, ``pixel_mean``, ``pixel_std``) come first.

    Attributes:
        num_layers: encoder blocks.
        num_heads: heads per block, an int or one int per block (pruned models).
        hidden_dim: token width.
        intermediate_dim: feed-forward width.
        position_score: a name of `keras_attnconv.layers.POSITION_SCORES`
            (``"quadratic"``, ``"gaussian"``, ``"learned"``, ``"siren"``, or
            one registered there), or None when no relative position term is used.
        position_embedding_dim: ``D_p`` of the learned encoding, an even
            positive int (half embeds the row shift, half the column shift);
            None means ``hidden_dim`` (its even part).
        use_content_content, use_content_position, use_position_bias: the
            score terms of eq. (8) (see `RelativeMultiHeadAttention`).
        quadratic_width: ``"alpha"`` or ``"spread"``, which weight holds a
            quadratic head's width (`QuadraticScore`'s ``width``): the paper's
            alpha, or the official code's spread ``s`` (alpha = s^2 / 2), which
            the paper recipes train. Other encodings ignore it: Gaussian heads
            always train their spreads (``Sigma^-1/2``), learned ones have none.
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
        attention_options: None or a dict of further `RelativeMultiHeadAttention`
            arguments for every block, among `ATTENTION_OPTIONS` (e.g.
            ``{"separable": False}`` forces the general eq. (8) path).
        dropout, attention_dropout: dropout rates.
        layer_norm_epsilon: LayerNorm epsilon.
        downsampling: block size of the invertible down-sampling.
        initialization: ``"bert"`` (kernels N(0, initializer_range^2), biases
            0, learned tables N(0, initializer_range^2), centers N(0, 2I) as the
            paper's text) or ``"official"``, what the official code's PyTorch
            model starts from: every linear map's kernel and bias
            ``U(+-1/sqrt(fan_in))`` (`FanInUniform`), learned shift tables
            N(0, 1), centers N(0, 2^2) per coordinate; the paper recipes use it.
        initializer_range: std (> 0) of the N(0, s^2) kernel initialisation (BERT's 0.02;
            ``initialization="bert"``).
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
    quadratic_width: str = "alpha"
    initialization: str = "bert"
    absolute_encoding: "str | None" = None
    attention_span: "dict | None" = None
    window: "int | tuple[int, int] | None" = None
    dilation: "int | tuple[int, int]" = 1
    rematerialize: bool = False
    attention_options: "dict | None" = None
    dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_epsilon: float = 1e-12
    downsampling: int = 2
    initializer_range: float = 0.02

    def __post_init__(self):
        super().__post_init__()
        for name in ("num_heads", "window", "dilation"):  # TOML and JSON give lists
            if isinstance(getattr(self, name), list):
                self._set(name, tuple(getattr(self, name)))
        check_config_fields(
            self,
            positive=("num_layers", "hidden_dim", "intermediate_dim", "downsampling"),
            rates=("dropout", "attention_dropout"),
            positive_numbers=("initializer_range", "layer_norm_epsilon"),
            optional_positive=("position_embedding_dim",),
            bools=("use_content_content", "use_content_position", "use_position_bias", "rematerialize"),
        )
        plain_numbers(self)  # the fields checked above, as JSON-serializable Python numbers
        if self.position_embedding_dim is not None and self.position_embedding_dim % 2:
            raise ValueError(
                "`position_embedding_dim` must be even: half of it embeds the row shift, half the column "
                f"shift. Received: position_embedding_dim={self.position_embedding_dim}"
            )
        if isinstance(self.num_heads, tuple):
            if len(self.num_heads) != self.num_layers or any(
                isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in self.num_heads
            ):
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
        window_arguments(self.window, self.dilation)  # the layer's own rules, before building
        uses_positions = self.use_content_position or self.use_position_bias
        if not uses_positions and self.position_score is not None:
            raise ValueError(
                "`position_score` must be None when no position term is used. "
                f"Received: position_score={self.position_score!r}"
            )
        check_choice("quadratic_width", self.quadratic_width, QuadraticScore.WIDTHS)
        check_choice("initialization", self.initialization, INITIALIZATIONS)
        if self.absolute_encoding not in (None, *ABSOLUTE_ENCODINGS):
            raise ValueError(
                f"`absolute_encoding` must be None, 'learned' or 'sinusoid'. "
                f"Received: absolute_encoding={self.absolute_encoding!r}"
            )
        if uses_positions:
            position_score_class(self.position_score)
        if self.attention_span is not None:
            if not isinstance(self.attention_span, dict):
                raise ValueError(
                    "`attention_span` must be None or a dict of AttentionSpan arguments. "
                    f"Received: attention_span={self.attention_span!r}"
                )
            try:
                AttentionSpan(1, **self.attention_span)
            except (TypeError, ValueError) as error:
                raise ValueError(f"Invalid `attention_span` {self.attention_span!r}: {error}") from None
        embedding_dim = self.position_embedding_dim or self.hidden_dim - self.hidden_dim % 2
        if (
            self.use_content_position
            and self.position_score == "learned"
            and embedding_dim > self.hidden_dim
            and not (self.attention_options or {}).get("position_key_projection")
        ):
            raise ValueError(
                "The content-position term meets the learned encoding with the first query features: "
                "`position_embedding_dim` must not exceed `hidden_dim` (or set attention_options="
                "{'position_key_projection': True}). Received: "
                f"position_embedding_dim={self.position_embedding_dim}, hidden_dim={self.hidden_dim}"
            )
        if not (self.use_content_content or self.use_content_position or self.use_position_bias):
            raise ValueError(
                "At least one of use_content_content, use_content_position, use_position_bias must be True: "
                "an attention needs a term to score with. Received: use_content_content=False, "
                "use_content_position=False, use_position_bias=False"
            )
        if self.attention_options is not None:
            if not isinstance(self.attention_options, dict):
                raise ValueError(
                    "`attention_options` must be None or a dict of RelativeMultiHeadAttention arguments. "
                    f"Received: attention_options={self.attention_options!r}"
                )
            for option in self.attention_options:
                if option not in ATTENTION_OPTIONS:
                    raise ValueError(
                        f"`attention_options` may set {', '.join(ATTENTION_OPTIONS)} (the config's own "
                        f"fields set the others).{did_you_mean(option, ATTENTION_OPTIONS)} "
                        f"Received: attention_options={self.attention_options!r}"
                    )
            try:  # the values, by the layer that takes them (constructing it allocates nothing)
                RelativeMultiHeadAttention(
                    self.heads_per_layer[0], position_score=self.position_score, **self.attention_arguments()
                )
            except (TypeError, ValueError) as error:
                raise ValueError(f"Invalid `attention_options` {self.attention_options!r}: {error}") from None

        check_sizes(self, self.largest_tensors())  # before the window's tables are made
        window, dilation = window_arguments(self.window, self.dilation)
        if window is not None:
            side = self.image_size // self.downsampling
            get_neighbourhood(side, side, window, dilation)  # whether the window fits the map

    def largest_tensors(self):
        """``(what, fields, elements)`` of the largest tensors of the model (see `check_sizes`)."""
        side = self.image_size // self.downsampling
        tokens, heads, hidden = side * side, max(self.heads_per_layer), self.hidden_dim
        options = self.attention_options or {}
        span = None if self.attention_span is None else AttentionSpan(1, **self.attention_span)
        window = window_arguments(self.window, self.dilation)[0] or (span.window[0] if span and span.window else None)
        content = self.use_content_content or self.use_content_position or options.get("use_key_bias", False)
        if window is not None:
            keys = window[0] * window[1]
        elif (
            not content
            and position_score_class(self.position_score).separable
            and options.get("separable") is not False
            and (span is None or span.separable)
        ):
            keys = 2 * side  # a row pass and a column pass
        else:
            keys = tokens
        tables = (2 * side - 1) * (self.position_embedding_dim or hidden) if self.position_score == "learned" else 0
        attention = hidden * hidden * (3 if content else 1)  # per head: the merged value/output (and query, key)
        weights = (
            sum(self.heads_per_layer) * attention
            + hidden * self.num_classes
            + tokens * hidden
            + self.num_layers * (2 * hidden * self.intermediate_dim + tables)
        )
        return [
            ("The logits kernel", ("num_classes", "hidden_dim"), hidden * self.num_classes),
            ("A block's feed-forward kernel", ("hidden_dim", "intermediate_dim"), hidden * self.intermediate_dim),
            ("A block's attention kernels", ("num_heads", "hidden_dim"), heads * attention),
            ("A block's learned position tables", ("image_size", "downsampling", "position_embedding_dim"), tables),
            (
                "One image's feature maps",
                ("image_size", "downsampling", "hidden_dim", "intermediate_dim"),
                tokens * max(hidden, self.intermediate_dim, 3 * self.downsampling**2),
            ),
            (
                "One image's attention scores",
                ("image_size", "downsampling", "num_heads", "window"),
                heads * tokens * keys,
            ),
            ("The weights", ("num_layers", "num_heads", "hidden_dim", "intermediate_dim", "num_classes"), weights),
        ]

    @property
    def heads_per_layer(self):
        """Number of heads of each block, as a tuple."""
        if isinstance(self.num_heads, tuple):
            return self.num_heads
        return (self.num_heads,) * self.num_layers

    def attention_arguments(self):
        """The `RelativeMultiHeadAttention` arguments of every block but its heads and position score."""
        arguments = {
            **(self.attention_options or {}),
            "use_content_content": self.use_content_content,
            "use_content_position": self.use_content_position,
            "use_position_bias": self.use_position_bias,
            "key_dim": self.hidden_dim,
        }
        if self.attention_span is not None:
            arguments["attention_span"] = dict(self.attention_span)
        if self.window is not None:  # only when set: configs saved before windows existed stay as they were
            arguments.update(window=self.window, dilation=self.dilation)
        return arguments
