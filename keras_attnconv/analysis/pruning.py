"""Appendix E: remove degenerate Gaussian heads from a trained model.

A head whose inverse covariance ``Sigma^{-1}`` is close to zero attends almost
uniformly to the whole image, and one whose ``Sigma^{-1}`` is very
ill-conditioned attends along a line; the paper prunes both kinds and then
fine-tunes with the learning rate divided by 10. Pruning slices weights, it
does not retrain: the kept heads compute exactly what they computed before.
"""

import dataclasses

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers import DiagonalGaussianScore, GaussianScore, QuadraticScore
from keras_attnconv.layers.encoder import encoder_blocks
from keras_attnconv.models import AttentionClassifier
from keras_attnconv.utils.checks import check_positive_number

#: Scores whose heads are Gaussians, with an inverse covariance to judge.
_GAUSSIAN_SCORES = (GaussianScore, DiagonalGaussianScore, QuadraticScore)

#: Variables indexed by head, and the axis of the head index.
_HEAD_AXIS = {
    "output_kernel": 0,
    "centers": 0,
    "alpha": 0,
    "spreads": 0,
    "inverse_sqrt_covariance": 0,
    "inverse_sqrt_variances": 0,
    "span_center": 0,
    "span_raw_sigma": 0,
}


@dataclasses.dataclass(frozen=True)
class LayerPruning:
    """What pruning did to one encoder block."""

    layer: str
    heads_before: int
    pruned: tuple
    reasons: dict

    @property
    def kept(self):
        return tuple(h for h in range(self.heads_before) if h not in self.pruned)


def _inverse_covariances(score):
    if isinstance(score, QuadraticScore):
        alpha = ops.convert_to_numpy(score.alpha).astype("float64")
        return 2.0 * alpha[:, None, None] * np.eye(2)[None]
    return ops.convert_to_numpy(score.inverse_covariance()).astype("float64")


def degenerate_heads(score, max_eigenvalue=1e-5, max_condition=1e5):
    """Indices of degenerate heads of a Gaussian/quadratic score, with the reason for each."""
    check_positive_number("max_eigenvalue", max_eigenvalue)  # a negative or NaN threshold would prune nothing
    check_positive_number("max_condition", max_condition)
    reasons = {}
    for head, inverse in enumerate(_inverse_covariances(score)):
        eigenvalues = np.abs(np.linalg.eigvalsh(inverse))
        largest, smallest = eigenvalues.max(), eigenvalues.min()
        if largest < max_eigenvalue:
            reasons[head] = f"max eigenvalue of Sigma^-1 {largest:.3g} < {max_eigenvalue:g}"
        elif smallest == 0 or largest / smallest > max_condition:
            condition = np.inf if smallest == 0 else largest / smallest
            reasons[head] = f"condition number {condition:.3g} > {max_condition:g}"
    return reasons


def prune_degenerate_heads(model, max_eigenvalue=1e-5, max_condition=1e5):
    """Returns ``(pruned_model, report)`` with the degenerate heads of every block removed.

    Args:
        model: an `AttentionClassifier` with position-only Gaussian
            (`GaussianScore`, `DiagonalGaussianScore`) or `QuadraticScore`
            attention, such as ``build_model("gaussian")``.
        max_eigenvalue: a head whose ``Sigma^{-1}`` has all eigenvalues below
            this attends (almost) uniformly: pruned.
        max_condition: a head whose ``Sigma^{-1}`` has a larger condition
            number is degenerate: pruned.

    Returns:
        The new model, an `AttentionClassifier` named ``<name>_pruned`` whose
        config has the kept heads (weights sliced from `model`, not retrained), and a list
        of `LayerPruning`, one per block. A block always keeps at least one
        head (the most concentrated one) so that it still has an attention.
    """
    check_positive_number("max_eigenvalue", max_eigenvalue)
    check_positive_number("max_condition", max_condition)
    if not isinstance(model, AttentionClassifier):
        raise ValueError(
            "`model` must be an AttentionClassifier (build_model, from_preset). "
            f"Received: model of class {type(model).__name__}"
        )
    blocks = encoder_blocks(model)
    report = []
    for block in blocks:
        score = block.attention.position_score
        if block.attention.uses_content or not isinstance(score, _GAUSSIAN_SCORES):
            what = "no relative position" if score is None else type(score).__name__
            content = " and content terms" if block.attention.uses_content else ""
            raise ValueError(
                f"`model` must have position-only quadratic or Gaussian heads to prune (Appendix E): its block "
                f"{block.name!r} has {what} scores{content}. Received: model={model.name!r}"
            )
        reasons = degenerate_heads(score, max_eigenvalue, max_condition)
        if len(reasons) == block.attention.num_heads:
            sharpest = int(np.argmax([np.linalg.eigvalsh(m).max() for m in _inverse_covariances(score)]))
            reasons.pop(sharpest)
        report.append(LayerPruning(block.name, block.attention.num_heads, tuple(sorted(reasons)), reasons))

    # A new configuration (fewer heads per block) and a copy of the kept heads' weights: the pruned model is an
    # AttentionClassifier of its own, which saves, reloads and exports as such.
    kept = {entry.layer: entry.kept for entry in report}
    config = {
        **model.get_config(),
        "num_heads": tuple(len(entry.kept) for entry in report),
        "name": f"{model.name}_pruned",
    }
    pruned = model.__class__.from_config(config)
    for old_layer in model.layers:
        new_layer = pruned.get_layer(old_layer.name)
        heads = kept.get(old_layer.name)
        for new_variable, old_variable in zip(new_layer.weights, old_layer.weights):
            value = ops.convert_to_numpy(old_variable)
            axis = _HEAD_AXIS.get(old_variable.name)
            if heads is not None and axis is not None:
                value = np.take(value, heads, axis=axis)
            new_variable.assign(value)
    return pruned, report


def compile_for_fine_tuning(model, total_steps, learning_rate=0.1, **compile_kwargs):
    """Compiles a pruned model to continue training with the learning rate divided by 10 (Appendix E).

    Uses the Table 2 optimiser (`CoupledWeightDecaySGD`, momentum 0.9, weight
    decay 1e-4, none on the centers and spreads as in the official code) with
    a cosine decay from ``learning_rate / 10`` over `total_steps` and no warm-up.
    """
    from keras_attnconv.layers import CENTER_AND_SPREAD_WEIGHTS
    from keras_attnconv.optim import CoupledWeightDecaySGD, WarmupCosineDecay

    schedule = WarmupCosineDecay(learning_rate / 10, total_steps=total_steps, warmup_steps=0)
    compile_kwargs.setdefault("loss", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    compile_kwargs.setdefault("metrics", ["accuracy"])
    optimizer = CoupledWeightDecaySGD(
        schedule, momentum=0.9, weight_decay=1e-4, no_decay_names=CENTER_AND_SPREAD_WEIGHTS
    )
    model.compile(optimizer=optimizer, **compile_kwargs)
    return model
