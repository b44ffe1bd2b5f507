"""The paper's optimisation: SGD with momentum and L2 weight decay, warm-up + cosine schedule; and the
label-smoothed loss, a training choice beyond the paper.

All are plain Keras objects (serializable, any backend), usable in a notebook::

    schedule = WarmupCosineDecay(0.1, total_steps=15_000, warmup_steps=750)
    model.compile(
        optimizer=CoupledWeightDecaySGD(schedule, momentum=0.9, weight_decay=1e-4),
        loss=LabelSmoothingCrossentropy(0.1, from_logits=True),
        metrics=["accuracy"],
    )
"""

import math

import keras
from keras import ops

from keras_attnconv.utils.checks import check_choice

# How the learning rate follows its warm-up + cosine (`run_schedule`).
SCHEDULES = ("official", "per_step")


@keras.saving.register_keras_serializable(package="keras_attnconv")
class WarmupCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak_learning_rate`, then cosine decay to 0.

    ``lr(step) = peak * step / warmup`` for ``step < warmup``, then
    ``peak * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2``, and 0
    after ``total_steps`` (Table 2: warm-up over 5% of the steps).

    With `steps_per_epoch`, the rate is held for a whole epoch at its value
    on the epoch's first step, as the official code sets it (once per
    epoch, ``scheduler.step(global_step)``): its first epoch runs at 0.
    `run_schedule` gives that code's schedule for a run.

    Args:
        peak_learning_rate: float > 0.
        total_steps: int >= 1, optimizer steps of the whole run.
        warmup_steps: int in [0, total_steps).
        steps_per_epoch: None (the rate changes every step) or int >= 1.
    """

    def __init__(self, peak_learning_rate, total_steps, warmup_steps=0, steps_per_epoch=None):
        if not peak_learning_rate > 0:
            raise ValueError(f"`peak_learning_rate` must be > 0. Received: peak_learning_rate={peak_learning_rate}")
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"`total_steps` must be a positive integer. Received: total_steps={total_steps!r}")
        if not isinstance(warmup_steps, int) or not 0 <= warmup_steps < total_steps:
            raise ValueError(
                f"`warmup_steps` must be an integer in [0, total_steps={total_steps}). "
                f"Received: warmup_steps={warmup_steps!r}"
            )
        if steps_per_epoch is not None and (
            isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int) or steps_per_epoch < 1
        ):
            raise ValueError(
                f"`steps_per_epoch` must be None or a positive integer. Received: steps_per_epoch={steps_per_epoch!r}"
            )
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.steps_per_epoch = steps_per_epoch

    def __call__(self, step):
        step = ops.cast(step, "float32")
        if self.steps_per_epoch is not None:  # the epoch's first step
            step = ops.floor(step / self.steps_per_epoch) * self.steps_per_epoch
        warmup = float(max(self.warmup_steps, 1))
        warm = self.peak_learning_rate * step / warmup
        progress = ops.clip((step - self.warmup_steps) / float(self.total_steps - self.warmup_steps), 0.0, 1.0)
        cosine = self.peak_learning_rate * 0.5 * (1.0 + ops.cos(math.pi * progress))
        return ops.where(step < self.warmup_steps, warm, cosine)

    @property
    def first_nonzero_step(self):
        """The first optimizer step whose rate is above 0; the steps before it leave the weights as they are.

        0 without a warm-up (the peak at once); with one, 1 where the rate
        changes every step (only step 0 is at 0), `steps_per_epoch` where it is
        held for an epoch (the first epoch is at 0). The held rate of that step
        is the warm-up's or the cosine's before its end: ``steps_per_epoch <
        total_steps``, as in `run_schedule`'s schedules.
        """
        if not self.warmup_steps:
            return 0
        return self.steps_per_epoch or 1

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "steps_per_epoch": self.steps_per_epoch,
        }


def run_schedule(kind, peak_learning_rate, epochs, steps_per_epoch, warmup_ratio, min_warmup_epochs=0.0):
    """The `WarmupCosineDecay` of a run of `epochs` x `steps_per_epoch` steps.

    ``"official"``: the official code's (``train.py``): the rate is set once per
    epoch, and the cosine is laid over ``epochs * (steps_per_epoch + 1)`` steps
    (its ``len(dataset) // batch_size + 1`` per epoch: 150,300 for the paper's
    300 epochs of 500 steps, with a warm-up of ``int(0.05 * 150,300) = 7,515``),
    so the rate never reaches 0. ``"per_step"``: the rate changes every step and
    the cosine ends on the run's last step.

    The warm-up lasts ``warmup_ratio`` of the run, or ``min_warmup_epochs``
    (at most half the run) where that is longer, in the schedule's own steps
    (``steps_per_epoch + 1`` an epoch for ``"official"``), rounded down. The
    paper warms up over 5% of 300 epochs, 15 epochs; 5% of a shortened run
    shrinks it to nothing (1.5 epochs at 30 epochs killed the quadratic
    model: docs/training.md), so a shorter run keeps ``min_warmup_epochs``,
    capped at half the run so that the rate still decays over the other half.
    A run whose ratio gives more (the paper's 300 epochs: 15) keeps its own.

    Raises ValueError, naming `epochs` and `kind`, for a run that would train
    every step at rate 0 and so learn nothing: one epoch of ``"official"``
    with a warm-up (it holds its first epoch at 0).
    """
    check_choice("schedule", kind, SCHEDULES)
    per_epoch = steps_per_epoch + 1 if kind == "official" else steps_per_epoch
    total_steps = epochs * per_epoch
    warmup = max(
        math.floor(warmup_ratio * total_steps),  # the official code's int(ratio * total), exactly
        math.floor(min(min_warmup_epochs, epochs / 2) * per_epoch),
    )
    schedule = WarmupCosineDecay(
        peak_learning_rate,
        total_steps,
        warmup_steps=warmup,
        steps_per_epoch=steps_per_epoch if kind == "official" else None,
    )
    if schedule.first_nonzero_step >= epochs * steps_per_epoch:
        raise ValueError(
            f"With the {kind!r} schedule and a warm-up, a run of {epochs} epoch(s) trains every step at learning "
            f"rate 0 (the rate of an epoch is that of its first step, 0 in the first epoch) and learns nothing: "
            f'train 2 epochs or more, or with schedule = "per_step" (or no warm-up: warmup_ratio = 0 and '
            f"min_warmup_epochs = 0). Received: epochs={epochs}, schedule={kind!r}"
        )
    return schedule


@keras.saving.register_keras_serializable(package="keras_attnconv")
class CoupledWeightDecaySGD(keras.optimizers.Optimizer):
    """SGD with momentum and weight decay as PyTorch's ``torch.optim.SGD`` does it.

    The L2 term is added to the gradient before momentum (coupled), unlike the
    decoupled ``weight_decay`` of Keras' own optimizers::

        g = grad + weight_decay * w
        m = momentum * m + g
        w = w - learning_rate * m

    This is the official code's optimiser (Table 2: lr 0.1, momentum 0.9,
    weight decay 1e-4), which exempts the attention centers and spreads from
    the decay: pass their weight names as `no_decay_names`
    (`keras_attnconv.layers.CENTER_AND_SPREAD_WEIGHTS`). Keras' own
    `exclude_from_weight_decay()` applies too.

    Args:
        learning_rate: float or `LearningRateSchedule`.
        momentum: float in [0, 1).
        weight_decay: float >= 0, the L2 coefficient.
        no_decay_names: variable names (exact, as ``variable.name``) that get no decay.
        **kwargs: other `keras.optimizers.Optimizer` arguments (clipnorm, ...).
    """

    def __init__(
        self,
        learning_rate=0.1,
        momentum=0.9,
        weight_decay=1e-4,
        no_decay_names=(),
        name="coupled_weight_decay_sgd",
        **kwargs,
    ):
        # `weight_decay` is ours (coupled); the base class' decoupled decay stays off.
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"`momentum` must be in [0, 1). Received: momentum={momentum}")
        if not weight_decay >= 0.0:
            raise ValueError(f"`weight_decay` must be >= 0. Received: weight_decay={weight_decay}")
        names = no_decay_names if isinstance(no_decay_names, (list, tuple)) else None
        if names is None or not all(isinstance(n, str) and n for n in names):
            raise ValueError(
                "`no_decay_names` must be a list of variable names (as `variable.name`). "
                f"Received: no_decay_names={no_decay_names!r}"
            )
        self.momentum = float(momentum)
        self.l2_weight_decay = float(weight_decay)
        self.no_decay_names = tuple(names)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.momenta = [self.add_variable_from_reference(v, name="momentum") for v in variables]
        # By key, not by name: `update_step` may see the backend's variable, named by its path on TensorFlow.
        self._no_decay_keys = {self._var_key(v) for v in variables if v.name in self.no_decay_names}

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        decays = self._var_key(variable) not in self._no_decay_keys and self._use_weight_decay(variable)
        if self.l2_weight_decay and decays:
            gradient = gradient + ops.cast(self.l2_weight_decay, variable.dtype) * variable
        momentum = self.momenta[self._get_variable_index(variable)]
        self.assign(momentum, ops.cast(self.momentum, variable.dtype) * momentum + gradient)
        self.assign_sub(variable, learning_rate * momentum)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "weight_decay": self.l2_weight_decay,
                "no_decay_names": list(self.no_decay_names),
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_attnconv")
class LabelSmoothingCrossentropy(keras.losses.Loss):
    """Cross-entropy of class-number labels against smoothed targets.

    `keras.losses.SparseCategoricalCrossentropy` with the ``label_smoothing``
    of `keras.losses.CategoricalCrossentropy`: the target of an example of
    class ``y`` among ``K`` is ``(1 - label_smoothing) * one_hot(y) +
    label_smoothing / K``, so the loss is ``(1 - label_smoothing) * -log p_y +
    label_smoothing * mean_k(-log p_k)``, without building the one-hot
    labels. It is computed in float32 whatever the logits' dtype.

    Args:
        label_smoothing: float in [0, 1); 0 is plain cross-entropy.
        from_logits: whether `y_pred` are logits (the package's models) or probabilities.
        reduction, name, dtype: as for any `keras.losses.Loss`.
    """

    def __init__(
        self,
        label_smoothing=0.1,
        from_logits=False,
        reduction="sum_over_batch_size",
        name="label_smoothing_crossentropy",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        if isinstance(label_smoothing, bool) or not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"`label_smoothing` must be in [0, 1). Received: label_smoothing={label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)
        self.from_logits = bool(from_logits)

    def call(self, y_true, y_pred):
        y_pred = ops.cast(y_pred, "float32")
        if self.from_logits:
            log_probabilities = ops.log_softmax(y_pred, axis=-1)
        else:  # as Keras does for probabilities: clipped away from 0 before the log
            epsilon = keras.backend.epsilon()
            log_probabilities = ops.log(ops.clip(y_pred, epsilon, 1.0 - epsilon))
        labels = ops.cast(ops.reshape(y_true, ops.shape(y_pred)[:-1]), "int32")
        true_class = -ops.take_along_axis(log_probabilities, ops.expand_dims(labels, -1), axis=-1)[..., 0]
        uniform = -ops.mean(log_probabilities, axis=-1)
        return (1.0 - self.label_smoothing) * true_class + self.label_smoothing * uniform

    def get_config(self):
        config = super().get_config()
        config.update({"label_smoothing": self.label_smoothing, "from_logits": self.from_logits})
        return config
