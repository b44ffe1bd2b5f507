"""A `fit`, `evaluate` or `predict` that fails leaves the model as it was: its weights, and a next call that works.

On JAX, Keras' trainer detaches every variable's value from the model while
it runs (``_purge_model_variables``: the compiled step is given the values,
and donates them, returning new ones) and attaches the last step's values
back at the end. `fit` does so after an error too; `evaluate` and `predict`
do not, and before a first step there is nothing to attach. So an error (the
model's own check of a batch: float images, another size) left those
variables without a value: the next call failed ("'NoneType' object is not
callable"), and a model trained in a notebook had lost its weights. On an
error the guard attaches what Keras did not: the last step's values where a
step of the failed call ran (Keras' own ``jax_state_sync``; the values noted
before it are consumed by then), else the values noted just before Keras
detached them (`note_values_to_detach`, called from the model's
``_purge_model_variables``). A note is a reference, not a copy: JAX's arrays
are immutable. (A step that fails while it runs, once it has consumed the
values, leaves nothing to attach: an out-of-memory error, for one.)

On TensorFlow, the first trace of a `fit` whose data does not tell its
shapes (a generator, a `PyDataset`) creates the optimizer's variables; when
that trace fails, the next `fit` traced the same `tf.function` again and
failed ("Creating variables on a non-first call"). On an error the guard
drops the traced steps, which the next call traces anew.
"""

import contextlib
import dataclasses

import keras


@dataclasses.dataclass
class _Notes:
    values: dict = dataclasses.field(default_factory=dict)  # {id(variable): (variable, its value before detaching)}
    state: object = None  # Keras' record of the last step's values when it detached them


_notes = {}  # {id(model): _Notes} while a guarded call of that model runs


def _trainer_variables(model):
    """Every variable Keras' JAX trainer may detach: the model's, the optimizer's and the metrics'."""
    optimizer = getattr(model, "optimizer", None)
    return [
        *model.trainable_variables,
        *model.non_trainable_variables,
        *(optimizer.variables if optimizer is not None else ()),
        *model.metrics_variables,
    ]


def note_values_to_detach(model):
    """Notes the values Keras is about to detach from `model`'s variables, where a guard runs (see the module)."""
    notes = _notes.get(id(model))
    if notes is None:
        return
    notes.state = getattr(model, "_jax_state", None)
    for variable in _trainer_variables(model):
        if variable._value is not None:
            notes.values[id(variable)] = (variable, variable._value)


def _attach_values(model, notes):
    state = getattr(model, "_jax_state", None)
    if state is not None and state is not notes.state:  # a step of the failed call ran (by identity: arrays)
        model.jax_state_sync()  # its values, as `fit` attaches them after an error
    for variable, value in notes.values.values():
        if variable._value is None:  # detached, and no step of the failed call gave it a value back
            variable.assign(value)


@contextlib.contextmanager
def model_kept_on_error(model):
    """Within the block, an error leaves `model` as it was (see the module).

    An inner guard (the `evaluate` of a `fit`) leaves the work to the outer one.
    """
    if id(model) in _notes:
        yield
        return
    _notes[id(model)] = notes = _Notes()
    try:
        yield
    except BaseException:  # KeyboardInterrupt too: a notebook's interrupted `fit`
        if keras.backend.backend() == "jax":
            _attach_values(model, notes)
        else:
            model.train_function = model.test_function = model.predict_function = None
        raise
    finally:
        del _notes[id(model)]
