"""The model zoo: registered configurations, `build_model`, `list_models`, `get_model_config`."""

import dataclasses

import keras

from keras_attnconv.models.attention_classifier import AttentionClassifierConfig
from keras_attnconv.models.resnet import ResNetConfig
from keras_attnconv.models.validation import dtype_policy
from keras_attnconv.utils.checks import check_seed, did_you_mean


@dataclasses.dataclass(frozen=True)
class PaperFigures:
    """What the paper reports for a configuration (None where it reports nothing)."""

    row: str
    params_millions: "float | None" = None
    flops_billions: "float | None" = None
    source: str = "Table 1"
    accuracy: "float | None" = None  # CIFAR-10 test accuracy after the paper's 300 epochs (Tables 1 and 4)


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    config: "AttentionClassifierConfig | ResNetConfig"
    paper: PaperFigures


_QUADRATIC = AttentionClassifierConfig()
_LEARNED = AttentionClassifierConfig(position_score="learned",
                                     # Row and column tables of hidden_dim each, as the reference code.
                                     position_embedding_dim=2 * 400)
# Two "learned emb. + content" models. The paper's text (section 4.3, its 29.5M): content-content plus
# content-position (q.k + q.r) on row and column tables of 200 each, no position bias.
_LEARNED_CONTENT = AttentionClassifierConfig(position_score="learned", position_embedding_dim=400,
                                             use_content_content=True, use_content_position=True,
                                             use_position_bias=False)
# The official code's (`--use_attention_data True`), which trained Table 1's row: content-content plus the
# position-only score of `learned` (tables of 400 each, per-head vectors), no content-position term.
_LEARNED_CONTENT_OFFICIAL = dataclasses.replace(_LEARNED, use_content_content=True)
_GAUSSIAN = AttentionClassifierConfig(position_score="gaussian")
# Follow-up: a learned Gaussian span (thesis slides: threshold 0.1) on top of the paper's encodings.
_SPAN = {"initial_sigma": 4.0, "threshold": 0.1}
_FOLLOW_UP = "follow-up thesis slides"
# Local attention (issue 19): a 7x7 neighbourhood (NATTEN's default kernel) covers the shifts of up to 3 pixels
# where the paper's quadratic heads settle in the first layers (its Figure 4), keeps 49 of the 256 keys of the
# 16x16 grid per query, and two such layers already see 13x13 pixels. The local span starts as wide as the
# window: at threshold 0.1 a Gaussian reaches 2.15 sigma, so sigma 1.5 reaches 3.2 pixels, and it learns within it.
_WINDOW = 7
_SPAN_LOCAL = {"initial_sigma": 1.5, "threshold": 0.1, "max_window": _WINDOW}
# Baselines: absolute encodings added to the tokens, content-content attention only.
_ABSOLUTE = AttentionClassifierConfig(position_score=None, use_content_content=True, use_position_bias=False,
                                      absolute_encoding="learned")
# Small enough to train in minutes on 2 CPU cores; same code, fewer and narrower blocks.
_TINY = {"num_layers": 2, "hidden_dim": 48, "intermediate_dim": 96}

_REGISTRY = {
    "resnet18": ModelEntry(ResNetConfig(), PaperFigures("ResNet18", 11.2, 1.1, accuracy=0.938)),
    "resnet10": ModelEntry(ResNetConfig(blocks_per_stage=(1, 1, 1, 1)),
                           PaperFigures("ResNet10", 4.9, source="draft, Table 1")),
    "quadratic": ModelEntry(_QUADRATIC, PaperFigures("SA quadratic emb.", 12.1, 6.2, accuracy=0.938)),
    "gaussian": ModelEntry(_GAUSSIAN, PaperFigures("SA quadratic emb. gen.", 12.1, 6.2, "Table 4", accuracy=0.934)),
    "gaussian_pruned": ModelEntry(dataclasses.replace(_GAUSSIAN, num_heads=(7, 5, 8, 7, 3, 9)),
                                  PaperFigures("SA quadratic emb. gen. pruned", 9.7, 4.9, "Table 4",
                                               accuracy=0.934)),
    "learned": ModelEntry(_LEARNED, PaperFigures("SA learned emb.", 12.3, 6.2, accuracy=0.918)),
    "learned_content": ModelEntry(_LEARNED_CONTENT, PaperFigures("SA learned emb. + content, the paper text's model",
                                                                 29.5, 15.0, accuracy=0.871)),
    "learned_content_official": ModelEntry(_LEARNED_CONTENT_OFFICIAL, PaperFigures(
        "SA learned emb. + content, the official code's model", 29.5, 15.0, accuracy=0.871)),
    "quadratic_16heads": ModelEntry(dataclasses.replace(_QUADRATIC, num_heads=16),
                                    PaperFigures("SA quadratic emb., 16 heads", source="Appendix F")),
    "siren": ModelEntry(AttentionClassifierConfig(position_score="siren"),
                        PaperFigures("SIREN relative encoding", source=_FOLLOW_UP)),
    "quadratic_span": ModelEntry(dataclasses.replace(_QUADRATIC, attention_span=_SPAN),
                                 PaperFigures("quadratic emb. + differentiable span", source=_FOLLOW_UP)),
    "learned_span": ModelEntry(dataclasses.replace(_LEARNED, attention_span=_SPAN),
                               PaperFigures("learned emb. + differentiable span", source=_FOLLOW_UP)),
    "absolute_learned": ModelEntry(_ABSOLUTE, PaperFigures("absolute learned encoding, content attention",
                                                           source="baseline")),
    "absolute_sinusoid": ModelEntry(dataclasses.replace(_ABSOLUTE, absolute_encoding="sinusoid"),
                                    PaperFigures("absolute 2-D sinusoids, content attention", source="baseline")),
    "learned_content_local": ModelEntry(dataclasses.replace(_LEARNED_CONTENT, window=_WINDOW),
                                        PaperFigures("learned emb. + content, 7x7 local attention",
                                                     source=_FOLLOW_UP)),
    "absolute_learned_local": ModelEntry(dataclasses.replace(_ABSOLUTE, window=_WINDOW),
                                         PaperFigures("absolute learned encoding, 7x7 local content attention",
                                                      source="baseline")),
    "quadratic_span_local": ModelEntry(dataclasses.replace(_QUADRATIC, attention_span=_SPAN_LOCAL),
                                       PaperFigures("quadratic emb. + differentiable span in a 7x7 window",
                                                    source=_FOLLOW_UP)),
    "resnet_tiny": ModelEntry(ResNetConfig(blocks_per_stage=(1, 1, 1), widths=(16, 32, 64)),
                              PaperFigures("(small CPU variant of ResNet)", source="ours")),
}
for _name in ("quadratic", "gaussian", "learned", "learned_content", "learned_content_official", "siren",
              "quadratic_span", "learned_span", "absolute_learned", "absolute_sinusoid", "learned_content_local",
              "absolute_learned_local", "quadratic_span_local"):
    _config = _REGISTRY[_name].config
    _dim = _config.position_embedding_dim and _config.position_embedding_dim * 48 // 400  # narrowed with hidden_dim
    _config = dataclasses.replace(_config, **_TINY, position_embedding_dim=_dim)
    _REGISTRY[f"{_name}_tiny"] = ModelEntry(_config, PaperFigures(f"(small CPU variant of {_name})", source="ours"))
del _name, _config, _dim


def list_models():
    """Names of all registered configurations, paper configurations first."""
    return list(_REGISTRY)


def _entry(name):
    if not isinstance(name, str):  # a list would not even hash
        raise ValueError(f"`name` must be a model name, one of list_models(). Received: name={name!r}")
    if name not in _REGISTRY:
        raise ValueError(f"Unknown model {name!r}.{did_you_mean(name, _REGISTRY)} Available: {', '.join(_REGISTRY)}. "
                         f"Received: name={name!r}")
    return _REGISTRY[name]


def get_model_config(name, **overrides):
    """The frozen config registered under `name`, with `overrides` applied and validated."""
    config = _entry(name).config
    if not overrides:
        return config
    return type(config).from_fields({**dataclasses.asdict(config), **overrides}, f"model {name!r}")


def get_paper_figures(name):
    """The paper's row, parameter count and FLOPs for `name` (`PaperFigures`)."""
    return _entry(name).paper


def build_model(name, *, num_classes=10, image_size=32, seed=None, dtype=None, **overrides):
    """Builds a registered model: ``keras_attnconv.build_model("quadratic", dtype="mixed_bfloat16")``.

    Args:
        name: a name from `list_models()`; the model's name (its identity
            when saved, preset and exported).
        num_classes: classes of the classifier (10 for CIFAR-10, 100 for CIFAR-100).
        image_size: side of the square uint8 input images.
        seed: int or None. When given, seeds Keras' global random state
            (``keras.utils.set_random_seed``) before building, so two builds
            with the same seed have the same weights.
        dtype: the dtype policy of every layer, as keras-hub's backbones take
            it: a name (``"float32"``, ``"mixed_float16"``, ``"mixed_bfloat16"``,
            ``"bfloat16"``, ...) or a `keras.DTypePolicy`; None is Keras' global
            policy (``keras.config.dtype_policy()``), which is never changed.
            The model's own ``dtype_policy`` is set too, so that ``compile``
            wraps the optimizer in a `LossScaleOptimizer` for ``"mixed_float16"``.
        **overrides: any other field of the model's config (``num_layers``,
            ``hidden_dim``, ``num_heads``, ``class_names``, ``pixel_mean``, ...).

    Returns:
        An uncompiled model of the family's class (`AttentionClassifier` or
        `ResNet`) from uint8 images ``(batch, image_size, image_size, 3)`` to
        float32 logits (the normalisation and the logits layer are float32
        under any `dtype`). Its ``get_config()`` is its configuration, so a
        ``.keras`` file of it reloads as the same class.
    """
    config = get_model_config(name, num_classes=num_classes, image_size=image_size, **overrides)
    dtype = dtype_policy(dtype)  # checked before the seed is set: a bad value changes nothing
    check_seed("seed", seed)
    if seed is not None:
        keras.utils.set_random_seed(seed)
    return config.build(name=name, dtype=dtype)
