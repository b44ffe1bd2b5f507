"""A `fit`, `evaluate` or `predict` that fails on JAX leaves the model its weights.

Keras' JAX trainer detaches every variable's value from the model while it
runs (``_purge_model_variables``, to hold one copy of the weights, the one
the compiled step passes on) and attaches the last step's values back at the
end. An error before a step has given values back, such as the model's own
check of its input (float images, another size) or a bad first batch, leaves
those variables without a value: the next call fails with "'NoneType'
object is not callable", and a model trained in a notebook has lost its
weights. (`fit` gives the last step's values back after a later error
itself.)

The model notes the values Keras is about to detach (`note_values_to_detach`,
called from its ``_purge_model_variables``), so that the guard around the
call can give a variable left without a value the value it had. A note is a
reference, not a copy (JAX's arrays are immutable); it keeps alive, for the
duration of the call, the memory Keras meant to free: one copy of the
weights and of the optimizer's state, small beside a training step's
activations for the zoo's models.
"""

import contextlib

import keras

# Per guarded model (by id, while its call runs): {id(variable): (variable, the value noted before detaching)}.
_notes = {}


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
    """Notes the value of each of `model`'s variables that has one, where a guard runs (see the module)."""
    notes = _notes.get(id(model))
    if notes is not None:
        for variable in _trainer_variables(model):
            if variable._value is not None:
                notes[id(variable)] = (variable, variable._value)


@contextlib.contextmanager
def weights_kept_on_error(model):
    """Within the block, an error leaves each of `model`'s variables a value (JAX only; see the module).

    An inner guard (the `evaluate` of a `fit`) leaves the work to the outer one.
    """
    if keras.backend.backend() != "jax" or id(model) in _notes:
        yield
        return
    _notes[id(model)] = notes = {}
    try:
        yield
    except BaseException:  # KeyboardInterrupt too: a notebook's interrupted `fit`
        for variable, value in notes.values():
            if variable._value is None:  # detached, and no step gave it a value back
                variable.assign(value)
        raise
    finally:
        del _notes[id(model)]
