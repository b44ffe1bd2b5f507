"""The paper's optimisation: SGD with momentum and L2 weight decay, warm-up + cosine schedule.

Both are plain Keras objects (serializable, any backend), usable in a notebook::

    schedule = WarmupCosineDecay(0.1, total_steps=15_000, warmup_steps=750)
    model.compile(optimizer=CoupledWeightDecaySGD(schedule, momentum=0.9, weight_decay=1e-4), ...)
"""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_attnconv")
class WarmupCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak_learning_rate`, then cosine decay to 0.

    ``lr(step) = peak * step / warmup`` for ``step < warmup``, then
    ``peak * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2``, and 0
    after ``total_steps`` (the schedule of the reference code, Table 2: warm-up
    over 5% of the steps).

    Args:
        peak_learning_rate: float > 0.
        total_steps: int >= 1, optimizer steps of the whole run.
        warmup_steps: int in [0, total_steps).
    """

    def __init__(self, peak_learning_rate, total_steps, warmup_steps=0):
        if not peak_learning_rate > 0:
            raise ValueError(f"`peak_learning_rate` must be > 0. Received: peak_learning_rate={peak_learning_rate}")
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"`total_steps` must be a positive integer. Received: total_steps={total_steps!r}")
        if not isinstance(warmup_steps, int) or not 0 <= warmup_steps < total_steps:
            raise ValueError(f"`warmup_steps` must be an integer in [0, total_steps={total_steps}). "
                             f"Received: warmup_steps={warmup_steps!r}")
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = float(max(self.warmup_steps, 1))
        warm = self.peak_learning_rate * step / warmup
        progress = ops.clip((step - self.warmup_steps) / float(self.total_steps - self.warmup_steps), 0.0, 1.0)
        cosine = self.peak_learning_rate * 0.5 * (1.0 + ops.cos(math.pi * progress))
        return ops.where(step < self.warmup_steps, warm, cosine)

    def get_config(self):
        return {"peak_learning_rate": self.peak_learning_rate, "total_steps": self.total_steps,
                "warmup_steps": self.warmup_steps}


@keras.saving.register_keras_serializable(package="keras_attnconv")
class CoupledWeightDecaySGD(keras.optimizers.Optimizer):
    """SGD with momentum and weight decay as PyTorch's ``torch.optim.SGD`` does it.

    The L2 term is added to the gradient before momentum (coupled), unlike the
    decoupled ``weight_decay`` of Keras' own optimizers::

        g = grad + weight_decay * w
        m = momentum * m + g
        w = w - learning_rate * m

    This is the reference implementation's optimiser (Table 2: lr 0.1,
    momentum 0.9, weight decay 1e-4). The decay applies to every trainable
    variable, as in the reference.

    Args:
        learning_rate: float or `LearningRateSchedule`.
        momentum: float in [0, 1).
        weight_decay: float >= 0, the L2 coefficient.
        **kwargs: other `keras.optimizers.Optimizer` arguments (clipnorm, ...).
    """

    def __init__(self, learning_rate=0.1, momentum=0.9, weight_decay=1e-4, name="coupled_weight_decay_sgd",
                 **kwargs):
        # `weight_decay` is ours (coupled); the base class' decoupled decay stays off.
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"`momentum` must be in [0, 1). Received: momentum={momentum}")
        if not weight_decay >= 0.0:
            raise ValueError(f"`weight_decay` must be >= 0. Received: weight_decay={weight_decay}")
        self.momentum = float(momentum)
        self.l2_weight_decay = float(weight_decay)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.momenta = [self.add_variable_from_reference(v, name="momentum") for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        if self.l2_weight_decay:
            gradient = gradient + ops.cast(self.l2_weight_decay, variable.dtype) * variable
        momentum = self.momenta[self._get_variable_index(variable)]
        self.assign(momentum, ops.cast(self.momentum, variable.dtype) * momentum + gradient)
        self.assign_sub(variable, learning_rate * momentum)

    def get_config(self):
        config = super().get_config()
        config.update({"momentum": self.momentum, "weight_decay": self.l2_weight_decay})
        return config
