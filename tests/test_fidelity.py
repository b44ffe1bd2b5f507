"""Fidelity to the official code (epfml/attention-cnn, train.py) as properties, without PyTorch.

The paper recipes train as the official code did: the learning rate set once
per epoch over its schedule's length, no weight decay on the attention
centers and spreads, PyTorch's SGD with momentum, the official
normalisation constants.
"""

import math
from pathlib import Path

import numpy as np
import pytest

import keras_attnconv
from keras_attnconv.data import CIFAR100_MEAN, CIFAR100_STD, dataset_info, pixel_statistics
from keras_attnconv.layers import CENTER_AND_SPREAD_WEIGHTS
from keras_attnconv.optim import run_schedule
from keras_attnconv.training import load_recipe, run_optimizer

RECIPES = Path(__file__).parents[1] / "training" / "recipes"
PAPER_RECIPES = ("quadratic", "learned", "learned_content", "learned_content_official", "gaussian", "resnet18")
CIFAR10_STEPS_PER_EPOCH = 50_000 // 100


def official_learning_rate(peak, epochs, steps_per_epoch, warmup_ratio, step):
    """The official code's rate at optimizer step `step`: LambdaLR stepped with the global step once per epoch."""
    max_steps = epochs * (steps_per_epoch + 1)  # num_epochs * (len(dataset) // batch_size + 1)
    warmup = int(max_steps * warmup_ratio)
    at = (step // steps_per_epoch) * steps_per_epoch  # the global step when this epoch's rate was set
    if at < warmup:
        return peak * at / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (at - warmup) / (max_steps - warmup)))


@pytest.mark.parametrize("name", PAPER_RECIPES)
def test_paper_recipes_follow_the_official_code_by_default(name):
    config = load_recipe(RECIPES / f"{name}.toml")
    assert (config.schedule, config.normalization, config.decay_centers_and_spreads) == ("official", "official", False)


def test_paper_schedule_is_the_official_one_at_chosen_steps():
    config = load_recipe(RECIPES / "quadratic.toml")
    schedule = run_schedule(config.schedule, config.learning_rate, config.epochs, CIFAR10_STEPS_PER_EPOCH,
                            config.warmup_ratio)
    assert (schedule.total_steps, schedule.warmup_steps) == (150_300, 7_515)
    steps = [0, 1, 499, 500, 999, 7_499, 7_500, 7_999, 8_000, 75_000, 149_999]
    rates = np.asarray([float(schedule(step)) for step in steps])
    expected = [official_learning_rate(0.1, 300, CIFAR10_STEPS_PER_EPOCH, 0.05, step) for step in steps]
    np.testing.assert_allclose(rates, expected, rtol=1e-6, atol=1e-9)
    assert rates[0] == rates[1] == rates[2] == 0.0  # the whole first epoch at 0
    assert rates[3] == rates[4] > 0 and rates[-1] > 0  # constant within an epoch; the last epoch above 0


def test_per_step_schedule_changes_every_step_and_ends_at_zero():
    schedule = run_schedule("per_step", 0.1, epochs=3, steps_per_epoch=10, warmup_ratio=0.1)
    assert (schedule.total_steps, schedule.warmup_steps, schedule.steps_per_epoch) == (30, 3, None)
    assert float(schedule(1)) != float(schedule(2)) and float(schedule(30)) == 0.0


def test_official_normalisation_is_the_official_codes_for_cifar10_and_cifar100():
    official = ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))
    for dataset in ("cifar10", "cifar100", "cifar10_sample"):
        assert pixel_statistics(dataset_info(dataset), "official") == official
    assert pixel_statistics(dataset_info("cifar100"), "dataset") == (CIFAR100_MEAN, CIFAR100_STD)


def pytorch_sgd(weight, gradients, lr, momentum, weight_decay):
    """torch.optim.SGD's update (no dampening, no Nesterov), in float64: the reference for the steps below."""
    weight, buffer = weight.astype("float64"), None
    for gradient in gradients:
        gradient = gradient + weight_decay * weight
        buffer = gradient if buffer is None else momentum * buffer + gradient
        weight = weight - lr * buffer
    return weight


@pytest.mark.parametrize("name", ["quadratic_tiny", "gaussian_tiny", "quadratic_span_tiny", "learned_tiny"])
@pytest.mark.parametrize("decay_centers_and_spreads", [False, True])
def test_a_step_with_zero_loss_gradient_only_decays_and_spares_the_centers_and_spreads(name, decay_centers_and_spreads):
    config = load_recipe(RECIPES / "quadratic.toml", decay_centers_and_spreads=decay_centers_and_spreads)
    model = keras_attnconv.build_model(name, dtype="float32")
    steps_per_epoch = 10
    schedule = run_schedule(config.schedule, config.learning_rate, 5, steps_per_epoch, config.warmup_ratio)
    optimizer = run_optimizer(config, schedule)
    weights = model.trainable_weights
    optimizer.build(weights)
    optimizer.iterations.assign(2 * steps_per_epoch)  # the third epoch: a rate above 0, the same for both steps
    lr = float(schedule(2 * steps_per_epoch))
    assert lr > 0
    before = [np.asarray(w).copy() for w in weights]
    for _ in range(2):  # the second step exercises the momentum
        optimizer.apply_gradients([(np.zeros(w.shape, "float32"), w) for w in weights])
    exempt = [w.name in CENTER_AND_SPREAD_WEIGHTS and not decay_centers_and_spreads for w in weights]
    assert any(w.name in CENTER_AND_SPREAD_WEIGHTS for w in weights) == (name != "learned_tiny")
    for weight, old, spared in zip(weights, before, exempt):
        expected = old if spared else pytorch_sgd(old, [np.zeros_like(old)] * 2, lr, config.momentum,
                                                  config.weight_decay)
        np.testing.assert_allclose(np.asarray(weight), expected, rtol=2e-7, atol=0, err_msg=weight.path)
        if not spared and np.any(old):
            assert not np.array_equal(np.asarray(weight), old), weight.path  # decayed by lr * wd * w, not rounded away
