"""Where a run computes: the strategy of a recipe (tf.distribute, or Keras' distribution API on JAX), which
process writes, and a Keras work-around.

Two engines share one ``strategy`` field. On TensorFlow, ``default``, ``mirrored`` and ``multi_worker``
are tf.distribute strategies. On JAX, ``data_parallel`` is `keras.distribution.DataParallel` over every
device of every process (JAX's coordinator joins the processes, `initialize_processes`), and ``default``
is one device, without a distribution. What a run does with either: `run_scope` (where it builds, fits
and evaluates), `replica_count`, `process_shard` (which slice of each global batch this process feeds)
and `is_chief` (which process writes).
"""

import contextlib
import os
import warnings

import keras

#: The strategies of each Keras backend (the others have only "default").
BACKEND_STRATEGIES = {"tensorflow": ("default", "mirrored", "multi_worker"), "jax": ("default", "data_parallel")}

#: Keras' own environment variables for `keras.distribution.initialize`, which `initialize_processes` reads too.
PROCESS_ENVIRONMENT = {
    "coordinator": "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "num_processes": "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "process_id": "KERAS_DISTRIBUTION_PROCESS_ID",
}

#: The first JAX release in whose runs of several processes on CPUs (gloo's collectives) two processes meet in
#: a collective only where both traced its program from the same lines of Python (JAX writes them into the
#: program; with other lines, the processes' collectives never met). The chief and the other processes reach
#: `fit` through different lines (`training.fit.train`), so under 0.12.1 both waited in the first step's
#: all-reduce forever (2026-12-08; 0.12.0.1 and earlier trained). `trace_alike_in_every_process` takes the
#: locations out.
LOCATIONS_SPLIT_CPU_COLLECTIVES_FROM = (0, 12, 1)

#: JAX's variable for `jax_traceback_in_locations_limit`, the frames of Python a traced operation records.
LOCATIONS_VARIABLE = "JAX_TRACEBACK_IN_LOCATIONS_LIMIT"


def release_numbers(version):
    """The leading numbers of a version string: "0.12.0.1" -> (0, 12, 0, 1), "0.13.0.dev20261201" -> (0, 13, 0)."""
    numbers = []
    for part in version.split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def locations_split_collectives(jax_version, platform, processes):
    """Whether `processes` processes on `platform` under JAX `jax_version` meet in a collective only where they
    traced its program from the same source lines (`LOCATIONS_SPLIT_CPU_COLLECTIVES_FROM`)."""
    return platform == "cpu" and processes > 1 and release_numbers(jax_version) >= LOCATIONS_SPLIT_CPU_COLLECTIVES_FROM


def trace_alike_in_every_process(processes, environ=None):
    """Traces without source locations where they would keep the processes' collectives apart; True if so.

    What is lost are the Python file and line of each operation in the compiled programs' metadata, which
    profiles and XLA dumps show; results and speed are the same. A `LOCATIONS_VARIABLE` in `environ` (default:
    the process') is the user's choice and stands: a warning says what it does here unless it is 0.
    """
    if processes < 2:  # before JAX's backend starts: one process may yet join others
        return False
    import jax

    if not locations_split_collectives(jax.__version__, jax.default_backend(), processes):
        return False
    environ = os.environ if environ is None else environ
    if LOCATIONS_VARIABLE in environ:
        if jax.config.jax_traceback_in_locations_limit != 0:
            warnings.warn(
                f"From JAX 0.12.1 on, the processes of a run on CPUs meet in a collective only where they traced "
                f"it from the same lines of Python, which this package's processes do not: the run hangs in its "
                f"first step unless {LOCATIONS_VARIABLE} is 0 (unset, this package sets it). Received: "
                f"{LOCATIONS_VARIABLE}={environ[LOCATIONS_VARIABLE]!r}, {processes} processes, JAX {jax.__version__}",
                stacklevel=4,  # the caller of `initialize_processes`
            )
        return False
    jax.config.update("jax_traceback_in_locations_limit", 0)
    return True


def make_strategy(name):
    """The strategy of a run: a tf.distribute strategy on TensorFlow, a Keras `Distribution` or None on JAX.

    ``"default"``: one device (on JAX: None, no distribution). ``"mirrored"``: every local GPU (or CPU)
    and ``"multi_worker"``: every worker of TF_CONFIG, both TensorFlow's. ``"data_parallel"`` (JAX): the
    global batch split evenly over every device of every process, after `initialize_processes`. A
    strategy of another backend is a ValueError naming it and the strategies this backend has.
    """
    backend = check_strategy(name)
    if backend == "jax":
        if name == "default":
            return None
        initialize_processes()
        # Each process feeds its own slice of every global batch (`process_shard`): Keras' auto-sharding
        # takes only tf.data, which the GPU machine lacks.
        return keras.distribution.DataParallel(auto_shard_dataset=False)
    if backend != "tensorflow":
        return None
    import tensorflow as tf

    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def check_strategy(name):
    """Checks that the Keras backend has the strategy `name`; returns the backend's name."""
    backend = keras.backend.backend()
    choices = BACKEND_STRATEGIES.get(backend, ("default",))
    if name not in choices:
        engine = {
            "mirrored": "tf.distribute, the TensorFlow backend",
            "multi_worker": "tf.distribute, the TensorFlow backend",
            "data_parallel": "Keras' distribution API on the JAX backend",
        }.get(name)
        raise ValueError(
            f"`strategy` {name!r} needs {engine or 'another backend'}; the backend is {backend!r}, "
            f"whose strategies are {', '.join(map(repr, choices))}. Received: strategy={name!r}"
        )
    return backend


def _is_keras_distribution(strategy):
    # Keras exports its distributions but not their base class.
    return isinstance(strategy, (keras.distribution.DataParallel, keras.distribution.ModelParallel))


def initialize_processes(coordinator=None, num_processes=None, process_id=None):
    """Joins this process to the others of a multi-process JAX run (`keras.distribution.initialize`), once.

    Each argument left None is read from Keras' environment variables
    (`PROCESS_ENVIRONMENT`: ``KERAS_DISTRIBUTION_JOB_ADDRESSES``, the coordinator's ``host:port``, which
    is process 0's; ``KERAS_DISTRIBUTION_NUM_PROCESSES``; ``KERAS_DISTRIBUTION_PROCESS_ID``). Without a
    coordinator and with at most one process, there is nothing to join: one process, its local devices.
    JAX allows this only before its first computation, so `attnconv train` calls it before it loads
    anything. Several processes on CPUs then trace alike (`trace_alike_in_every_process`). Returns the
    number of processes.
    """
    import jax

    given = {"coordinator": coordinator, "num_processes": num_processes, "process_id": process_id}
    values = {
        name: os.environ.get(variable) if given[name] is None else given[name]
        for name, variable in PROCESS_ENVIRONMENT.items()
    }
    for name in ("num_processes", "process_id"):
        values[name] = _whole_number(name, values[name])
    count, index = values["num_processes"], values["process_id"]
    if values["coordinator"] is None and count in (None, 1):
        return _joined(jax.process_count() if jax.distributed.is_initialized() else 1)
    if count is None or index is None or values["coordinator"] is None:
        missing = [name for name in ("coordinator", "num_processes", "process_id") if values[name] is None]
        raise ValueError(
            f"A run of several processes needs the coordinator's address, the number of processes "
            f"and this process' id (--coordinator, --num-processes, --process-id, or "
            f"{', '.join(PROCESS_ENVIRONMENT.values())}); {', '.join(missing)} missing. Received: "
            + ", ".join(f"{name}={values[name]!r}" for name in PROCESS_ENVIRONMENT)
        )
    if count < 1 or not 0 <= index < count:
        raise ValueError(
            f"`process_id` must lie in [0, num_processes). Received: process_id={index}, num_processes={count}"
        )
    check_coordinator(values["coordinator"])
    if jax.distributed.is_initialized():
        if jax.process_count() != count or jax.process_index() != index:
            raise ValueError(
                f"This process already joined a run of {jax.process_count()} processes as process "
                f"{jax.process_index()}. Received: num_processes={count}, process_id={index}"
            )
        return _joined(count)
    keras.distribution.initialize(values["coordinator"], num_processes=count, process_id=index)
    return _joined(count)


def _joined(count):
    """`count`, once this process traces as the others do (`trace_alike_in_every_process`)."""
    trace_alike_in_every_process(count)
    return count


def check_coordinator(address):
    """Raises ValueError naming `coordinator` unless `address` is ``host:port`` with a port in 1..65535.

    JAX would index past the end of a bare host, and wait forever on a port that cannot exist.
    """
    host, separator, port = str(address).rpartition(":")
    if not (separator and host and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(
            f"`coordinator` must be the coordinator's address as host:port, with a port from 1 to "
            f"65535 (process 0 listens there). Received: coordinator={address!r}"
        )


def _whole_number(name, value):
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"`{name}` must be a whole number. Received: {name}={value!r}") from None


def replica_count(strategy):
    """How many replicas share each global batch: devices (JAX) or replicas in sync (tf.distribute); 1 alone."""
    if strategy is None:
        return 1
    if _is_keras_distribution(strategy):
        return strategy.num_model_replicas
    return strategy.num_replicas_in_sync


def process_shard(strategy):
    """(this process' index, processes): each process feeds its slice of every global batch (JAX); (0, 1) else.

    tf.distribute shards a tf.data input itself, so its processes each get the global batches.
    """
    if _is_keras_distribution(strategy):
        import jax

        return jax.process_index(), jax.process_count()
    return 0, 1


def run_scope(strategy):
    """The scope of a whole run (build, fit, evaluate): Keras' distribution must be current while it computes.

    A tf.distribute strategy's scope is entered only to build and compile (`build_scope`): Keras keeps the
    strategy it was compiled under.
    """
    return strategy.scope() if _is_keras_distribution(strategy) else contextlib.nullcontext()


def build_scope(strategy):
    """The scope in which the model and its optimizer are made (tf.distribute's; `run_scope` covers JAX's)."""
    if strategy is None or _is_keras_distribution(strategy):
        return contextlib.nullcontext()
    return strategy.scope()


def uses_tf_data(strategy):
    """Whether the run feeds tf.data (tf.distribute shards it over its workers) rather than NumPy batches."""
    return strategy is not None and not _is_keras_distribution(strategy)


def wait_for_every_process(strategy, name):
    """Waits until every process of a multi-process JAX run reaches the point `name`; at once otherwise."""
    if _is_keras_distribution(strategy) and process_shard(strategy)[1] > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def is_chief(strategy):
    """Whether this process writes the run directory: process 0 of a JAX run, the chief of a TF_CONFIG cluster.

    tf.distribute's own rule (``should_checkpoint``): the task of type "chief",
    or worker 0 in a cluster without one; always true for one-machine strategies.
    """
    if strategy is None:
        return True
    if _is_keras_distribution(strategy):
        return process_shard(strategy)[0] == 0
    return strategy.extended.should_checkpoint


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
