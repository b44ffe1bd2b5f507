"""Appendix E pruning: exactly the degenerate heads go, the others compute what they did."""

import numpy as np
import pytest
from keras import ops

from keras_attnconv import build_model
from keras_attnconv.analysis.pruning import compile_for_fine_tuning, prune_degenerate_heads

SMALL = {"num_layers": 2, "hidden_dim": 8, "intermediate_dim": 8, "image_size": 8}


def degenerate_model():
    model = build_model("gaussian_tiny", seed=0, **SMALL)
    first = model.get_layer("encoder_0").attention.position_score
    sqrt = ops.convert_to_numpy(first.inverse_sqrt_covariance).copy()
    sqrt[1] = 1e-4 * np.eye(2)  # Sigma^-1 ~ 1e-8 I: uniform attention
    sqrt[4] = np.diag([1.0, 1e-4])  # condition number 1e8: a line
    first.inverse_sqrt_covariance.assign(sqrt)
    second = model.get_layer("encoder_1").attention.position_score
    sqrt = ops.convert_to_numpy(second.inverse_sqrt_covariance).copy()
    sqrt[0] = np.diag([1.0, 1e-2])  # condition number 1e4: kept at the default 1e5
    second.inverse_sqrt_covariance.assign(sqrt)
    return model


def test_prunes_exactly_the_degenerate_heads():
    model = degenerate_model()
    pruned, report = prune_degenerate_heads(model)
    assert [entry.pruned for entry in report] == [(1, 4), ()]
    assert "eigenvalue" in report[0].reasons[1] and "condition" in report[0].reasons[4]
    assert [b.attention.num_heads for b in pruned.layers if hasattr(b, "attention")] == [7, 9]
    per_head = 8 * 8 + 2 + 4  # output kernel block, center, Sigma^{-1/2}
    assert model.count_params() - pruned.count_params() == 2 * per_head


def test_the_pruned_model_is_a_new_configuration_that_saves_and_reloads_as_itself(tmp_path):
    import keras

    model = degenerate_model()
    pruned, _ = prune_degenerate_heads(model)
    assert type(pruned) is type(model) and pruned.name == "gaussian_tiny_pruned"
    assert pruned.config.num_heads == (7, 9) and pruned.get_config()["num_heads"] == (7, 9)
    pruned.save(tmp_path / "pruned.keras")
    reloaded = keras.saving.load_model(tmp_path / "pruned.keras")
    assert reloaded.config == pruned.config
    x = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    np.testing.assert_array_equal(ops.convert_to_numpy(reloaded(x)), ops.convert_to_numpy(pruned(x)))


def assert_pruned_equals_silenced(model, pruned, heads):
    """The original with the pruned heads' output silenced is the same function as the pruned model."""
    attention = model.get_layer("encoder_0").attention
    kernel = ops.convert_to_numpy(attention.output_kernel).copy()
    kernel[list(heads)] = 0.0
    attention.output_kernel.assign(kernel)
    x = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    np.testing.assert_allclose(ops.convert_to_numpy(pruned(x)), ops.convert_to_numpy(model(x)), atol=1e-5)


def test_kept_heads_compute_what_they_computed():
    model = degenerate_model()
    pruned, _ = prune_degenerate_heads(model)
    assert_pruned_equals_silenced(model, pruned, (1, 4))


def test_kept_heads_keep_their_attention_span():
    model = build_model("quadratic_span_tiny", seed=0, **SMALL)
    attention = model.get_layer("encoder_0").attention
    alpha = ops.convert_to_numpy(attention.position_score.alpha).copy()
    alpha[2] = 1e-9  # Sigma^-1 = 2 alpha I ~ 0: uniform attention
    attention.position_score.alpha.assign(alpha)
    rng = np.random.default_rng(1)
    span = attention.attention_span
    span.span_center.assign(rng.normal(0.0, 1.0, span.span_center.shape).astype("float32"))
    span.span_raw_sigma.assign(rng.uniform(0.0, 2.0, span.span_raw_sigma.shape).astype("float32"))
    pruned, report = prune_degenerate_heads(model)
    assert report[0].pruned == (2,)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(pruned.get_layer("encoder_0").attention.attention_span.sigma),
        np.delete(ops.convert_to_numpy(span.sigma), 2, axis=0),
    )
    assert_pruned_equals_silenced(model, pruned, (2,))


@pytest.mark.parametrize(
    "thresholds, message",
    [
        ({"max_eigenvalue": -1.0}, "max_eigenvalue=-1.0"),
        ({"max_condition": float("nan")}, "max_condition=nan"),
        ({"max_condition": "1e5"}, "max_condition='1e5'"),
    ],
)
def test_thresholds_that_would_prune_nothing_are_refused(thresholds, message):
    with pytest.raises(ValueError, match=message):
        prune_degenerate_heads(degenerate_model(), **thresholds)


def test_threshold_arguments_decide():
    _, report = prune_degenerate_heads(degenerate_model(), max_condition=1e3)
    assert report[1].pruned == (0,)


def test_rejects_models_without_gaussian_heads():
    with pytest.raises(ValueError, match="must be an AttentionClassifier.*class ResNet"):
        prune_degenerate_heads(build_model("resnet_tiny"))
    with pytest.raises(
        ValueError,
        match=r"position-only quadratic or Gaussian heads .*: its block 'encoder_0' has LearnedRelativeScore scores\. "
        r"Received: model='learned_tiny'$",
    ):
        prune_degenerate_heads(build_model("learned_tiny", **SMALL))
    with pytest.raises(ValueError, match=r"'encoder_0' has QuadraticScore scores and content terms\. Received"):
        prune_degenerate_heads(build_model("quadratic_tiny", use_content_content=True, **SMALL))


def test_fine_tuning_uses_a_tenth_of_the_learning_rate():
    pruned, _ = prune_degenerate_heads(degenerate_model())
    compile_for_fine_tuning(pruned, total_steps=10, learning_rate=0.1)
    assert float(ops.convert_to_numpy(pruned.optimizer.learning_rate)) == pytest.approx(0.01)  # step 0
    loss = pruned.train_on_batch(np.zeros((2, 8, 8, 3), "uint8"), np.array([0, 1]))
    assert np.isfinite(loss[0] if isinstance(loss, list) else loss)
