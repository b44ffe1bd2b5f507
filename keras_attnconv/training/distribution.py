"""Where a run computes: the tf.distribute strategy of a recipe, which process writes, and a Keras work-around."""

import keras


def make_strategy(name):
    """The tf.distribute strategy: one device, all local GPUs (or CPUs), or all workers of TF_CONFIG.

    On other backends only ``"default"`` exists (None: no strategy scope).
    """
    if keras.backend.backend() != "tensorflow":
        if name != "default":
            raise ValueError(f"`strategy` {name!r} needs the TensorFlow backend (tf.distribute); the backend is "
                             f"{keras.backend.backend()!r}. Received: strategy={name!r}")
        return None
    import tensorflow as tf

    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def is_chief(strategy):
    """Whether this process writes the run directory: yes, except on the other workers of a TF_CONFIG cluster.

    tf.distribute's own rule (``should_checkpoint``): the task of type "chief",
    or worker 0 in a cluster without one; always true for one-machine strategies.
    """
    return strategy is None or strategy.extended.should_checkpoint


def work_around_keras_multi_worker(model, strategy, batch):
    """Works around keras-team/keras#20585 (open; Keras 3 through 3.15): ``fit`` under MultiWorkerMirroredStrategy.

    Keras' TensorFlow trainer fails there twice: (1) before training it builds
    the model from the first distributed batch, which it first averages with
    ``strategy.reduce`` outside a replica context ("Attempt to convert a value
    (PerReplica...)"): build it from one plain NumPy batch instead, which needs
    no reduction; (2) after each step it averages the scalar logs with
    ``strategy.reduce("MEAN", value, axis=0)``, an axis that a scalar lacks:
    reduce scalars without an axis (their mean over the replicas).
    """
    build = model._maybe_symbolic_build
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: build(data_batch=batch)
    reduce = strategy.reduce

    def reduce_scalars_without_axis(reduce_op, value, axis):
        local = strategy.experimental_local_results(value)[0]
        return reduce(reduce_op, value, axis=None if local.shape.rank == 0 else axis)

    strategy.reduce = reduce_scalars_without_axis
