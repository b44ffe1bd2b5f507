"""XLA clusters of the element-wise ops inside TensorFlow's graph step, beside oneDNN's bfloat16 matmuls.

On a CPU with bfloat16 units the rule (`step_compilation`) trains a large
model in TensorFlow's graph, whose matmuls oneDNN runs on those units. The
graph's element-wise ops (GELU, layer normalization, dropout, the casts,
and their gradients) run one by one in Eigen, no faster in bfloat16 than
in float32: half of the quadratic model's mixed_bfloat16 op time. TensorFlow's
auto-clustering, restricted to element-wise ops
(``--tf_xla_ops_to_cluster=FUSIBLE``), compiles runs of them into fused XLA
kernels and leaves the matmuls to oneDNN. Measured (docs/performance.md,
"Element-wise ops in XLA clusters"; `attnconv bench --suite clusters`) on an
Intel Xeon with AMX, mixed_bfloat16: the attention models' steps were
1.08-1.30x as fast (quadratic 1.15x), ResNet-18's 0.89x; in float32,
`learned_content`'s 1.10x, the other attention models' 0.98-1.04x,
ResNet-18's 0.88x. On an AMD EPYC with AVX-512 BF16, whose matmuls gain
less from bfloat16, mixed_bfloat16: `learned_content` 1.13x,
`learned_content_local` 1.05x, quadratic and `learned` 0.93-1.12x over
three runs (a tie), ResNet-18 0.95-1.25x (1.25x and 1.16x when its plain
step ran slow, 0.95x in the longest run); float32 `learned_content` 1.10x.
Hence the attention models in mixed_bfloat16, and in float32 those whose
content scores cover every position (`clustered_precisions`), only where
``jit_compile="auto"`` picks the graph.

TensorFlow reads these flags once, when its runtime starts (its first op or
device query); set later they change nothing. So they are an application's
setting, not a model's: `attnconv train` sets them before anything runs
(`enable_for`), and a notebook sets ``TF_XLA_FLAGS`` before starting Python.
A ``TF_XLA_FLAGS`` of the user's is left as it is.
"""

import os

#: TensorFlow's auto-clustering on a CPU, of element-wise ops only.
FLAGS = ("--tf_xla_auto_jit=2", "--tf_xla_cpu_global_jit", "--tf_xla_ops_to_cluster=FUSIBLE")
VARIABLE = "TF_XLA_FLAGS"


def takes_element_clusters(backend, precision, jit_compile, gaining_precisions, bfloat16_units, strategy="default"):
    """Whether a run's graph step gains from element-wise XLA clusters (the measurements in the module docstring).

    Args:
        backend: Keras' backend name (only TensorFlow has a graph step).
        precision: the run's dtype policy name.
        jit_compile: the run's setting; only ``"auto"``, the measured path, takes them (``False`` is the plain
            graph, kept for comparisons).
        gaining_precisions: the precisions whose graph step of the run's model was measured faster with them
            (`clustered_precisions`).
        bfloat16_units: the CPU's (`cpu_capabilities`), or None: without them the rule takes XLA for the step.
        strategy: the run's; only one process on one device was measured.
    """
    return (
        backend == "tensorflow"
        and precision in gaining_precisions
        and jit_compile == "auto"
        and bfloat16_units is not None
        and strategy == "default"
    )


def clustered_precisions(name):
    """The precisions in which model `name`'s graph step was measured faster with the clusters (module docstring).

    An `AttentionClassifier`'s in mixed_bfloat16, whose element-wise ops Eigen runs no faster than in float32;
    in float32 too where its content scores cover every position (a (batch, heads, T, T) float32 softmax and its
    dropout per layer, `learned_content`: 1.08-1.10x on both kinds of CPU), not where a window bounds them. No
    precision for a ResNet (slower with them on the Xeon) nor for an unregistered name (a fine-tuned preset's
    pruned model): not measured.
    """
    from keras_attnconv.models.attention_classifier import AttentionClassifierConfig
    from keras_attnconv.models.registry import get_model_config

    try:
        config = get_model_config(name)
    except (KeyError, ValueError):
        return frozenset()
    if not isinstance(config, AttentionClassifierConfig):
        return frozenset()
    content_everywhere = (config.use_content_content or config.use_content_position) and config.window is None
    return frozenset({"mixed_bfloat16", "float32"} if content_everywhere else {"mixed_bfloat16"})


def train_sets_them(model, precision, bfloat16_units, environ=None, jit_compile="auto", strategy="default"):
    """Whether `attnconv train` of `model` in `precision` (with `jit_compile` and `strategy`, this backend) on
    a CPU with `bfloat16_units` (`cpu_capabilities`) would set the flags (`takes_element_clusters`): never where
    `environ` (default: the process') has a ``TF_XLA_FLAGS`` of its own, which train leaves as it is."""
    import keras

    environ = os.environ if environ is None else environ
    if VARIABLE in environ:
        return False
    gaining = clustered_precisions(model)
    return takes_element_clusters(keras.backend.backend(), precision, jit_compile, gaining, bfloat16_units, strategy)


def worker_environment(clustered):
    """The variables a fresh process (`run_in_workers`) starts with to run with the clusters or without any
    ``TF_XLA_FLAGS`` (None takes the variable out): a user's own flags are neither case."""
    return {VARIABLE: " ".join(FLAGS) if clustered else None}


def in_effect(environ=None):
    """Whether `environ`'s (default: the process') ``TF_XLA_FLAGS`` clusters the graph's element-wise ops."""
    given = (os.environ if environ is None else environ).get(VARIABLE, "").split()
    return all(flag in given for flag in FLAGS)


def tensorflow_started():
    """Whether TensorFlow's runtime has started or listed its devices: it has read ``TF_XLA_FLAGS`` then, once."""
    from tensorflow.python.eager import context

    current = context.context()
    # Private attributes (TensorFlow has no public test of this); where they are gone, take it as started.
    return getattr(current, "_context_handle", True) is not None or getattr(current, "_physical_devices", 0) is not None


def enable_for(config, environ=None):
    """Sets ``TF_XLA_FLAGS`` to `FLAGS` in `environ` (default: the process') where `config`'s step takes them.

    Call it before TensorFlow's runtime starts: once it has (`tensorflow_started`: a notebook, or
    `attnconv` called from Python), nothing is set, since the flags would change nothing and the step's
    description would claim them. Returns whether the flags are now set by this call; a ``TF_XLA_FLAGS`` the
    user set is never changed.

    Args:
        config: a `keras_attnconv.training.TrainConfig`.
        environ: the environment to change (a dict in tests).
    """
    from keras_attnconv.utils.reports import cpu_capabilities

    environ = os.environ if environ is None else environ
    units = cpu_capabilities()["bfloat16_units"]
    takes = train_sets_them(config.model, config.precision, units, environ, config.jit_compile, config.strategy)
    if takes and not tensorflow_started():
        environ[VARIABLE] = " ".join(FLAGS)
        return True
    return False
