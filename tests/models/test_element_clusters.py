"""Element-wise XLA clusters in TensorFlow's graph step: which runs take them, and that `attnconv train` sets them
before TensorFlow's runtime starts (it reads them once)."""

import os
import subprocess
import sys
import textwrap

import pytest

from keras_attnconv.models import element_clusters
from keras_attnconv.models.element_clusters import FLAGS, takes_element_clusters

pytestmark = pytest.mark.backend_independent

#: A run that takes them: the measured case.
TAKES = {
    "backend": "tensorflow",
    "precision": "mixed_bfloat16",
    "jit_compile": "auto",
    "gaining_precisions": frozenset({"mixed_bfloat16"}),  # an attention model's (`clustered_precisions`)
    "bfloat16_units": "AMX",
    "strategy": "default",
}


def test_a_mixed_bfloat16_attention_model_on_a_cpu_with_bfloat16_units_takes_them():
    assert takes_element_clusters(**TAKES)
    assert takes_element_clusters(**{**TAKES, "bfloat16_units": "AVX-512 BF16"})


@pytest.mark.parametrize(
    "change",
    [
        {"backend": "jax"},  # no graph step
        {"precision": "float32"},  # measured no clear gain for most attention models (0.98-1.04x)
        {"precision": "mixed_float16"},
        {"jit_compile": False},  # the plain graph, kept for comparisons
        {"jit_compile": True},
        {"gaining_precisions": frozenset()},  # ResNet-18 measured slower (0.89x)
        {"bfloat16_units": None},  # the rule takes XLA for the whole step there
        {"strategy": "mirrored"},  # not measured
    ],
    ids=str,
)
def test_any_other_run_does_not(change):
    assert not takes_element_clusters(**{**TAKES, **change})


def test_a_float32_run_takes_them_where_its_model_gains_in_float32():
    assert takes_element_clusters(**{**TAKES, "precision": "float32", "gaining_precisions": {"float32"}})


@pytest.mark.parametrize(
    "model, gaining",
    [
        ("quadratic", {"mixed_bfloat16"}),
        ("learned", {"mixed_bfloat16"}),
        ("learned_content", {"mixed_bfloat16", "float32"}),  # content scores over every position: 1.10x in float32
        ("learned_content_local", {"mixed_bfloat16"}),  # a window bounds them: 0.98x in float32
        ("resnet18", set()),  # 0.89x in mixed_bfloat16 on the Xeon
        ("quadratic_pruned", set()),  # an unregistered model: not measured
    ],
)
def test_the_precisions_each_model_gains_in_are_the_measured_ones(model, gaining):
    assert element_clusters.clustered_precisions(model) == gaining


def test_what_train_would_set_for_a_benchmarks_case_is_its_rule_unless_the_user_set_the_variable(monkeypatch):
    # The benchmarks time a case's graph step as train runs it (the steps and profile suites).
    monkeypatch.setattr("keras.backend.backend", lambda: "tensorflow")
    assert element_clusters.train_sets_them("quadratic", "mixed_bfloat16", "AMX", environ={})
    assert not element_clusters.train_sets_them("resnet18", "mixed_bfloat16", "AMX", environ={})
    assert not element_clusters.train_sets_them("quadratic", "float32", "AMX", environ={})
    assert element_clusters.train_sets_them("learned_content", "float32", "AVX-512 BF16", environ={})
    assert not element_clusters.train_sets_them("quadratic", "mixed_bfloat16", None, environ={})
    given = {"TF_XLA_FLAGS": "--tf_xla_auto_jit=-1"}
    assert not element_clusters.train_sets_them("quadratic", "mixed_bfloat16", "AMX", environ=given)


def test_a_workers_environment_sets_the_flags_or_takes_the_variable_out():
    assert element_clusters.worker_environment(True) == {"TF_XLA_FLAGS": " ".join(FLAGS)}
    assert element_clusters.worker_environment(False) == {"TF_XLA_FLAGS": None}  # run_in_workers: None removes


@pytest.fixture
def bfloat16_cpu(monkeypatch):
    from keras_attnconv.utils import reports

    real = reports.cpu_capabilities
    monkeypatch.setattr(reports, "cpu_capabilities", lambda *a: {**real(*a), "bfloat16_units": "AMX"})
    monkeypatch.setattr("keras.backend.backend", lambda: "tensorflow")
    monkeypatch.setattr(element_clusters, "tensorflow_started", lambda: False)  # as in a fresh `attnconv train`


def _config(**fields):
    from keras_attnconv.training.recipe import TrainConfig

    return TrainConfig(**{"model": "quadratic", "precision": "mixed_bfloat16", **fields})


def test_train_sets_them_for_a_run_that_takes_them(bfloat16_cpu):
    environ = {}
    assert element_clusters.enable_for(_config(), environ)
    assert environ == {"TF_XLA_FLAGS": " ".join(FLAGS)} and element_clusters.in_effect(environ)


@pytest.mark.parametrize("model", ["resnet18", "quadratic_pruned"], ids=["ResNet", "an unregistered model"])
def test_train_leaves_them_out_for_a_model_not_measured_faster(bfloat16_cpu, model):
    environ = {}
    assert not element_clusters.enable_for(_config(model=model), environ) and environ == {}


def test_once_tensorflow_has_started_nothing_is_set_since_it_would_change_nothing(bfloat16_cpu, monkeypatch):
    # attnconv called from a notebook or a test: the step's description would claim clusters it does not have.
    monkeypatch.setattr(element_clusters, "tensorflow_started", lambda: True)
    environ = {}
    assert not element_clusters.enable_for(_config(), environ) and environ == {}


@pytest.mark.parametrize("given", ["", "--tf_xla_auto_jit=-1"])
def test_a_tf_xla_flags_of_the_users_is_left_as_it_is(bfloat16_cpu, given):
    environ = {"TF_XLA_FLAGS": given}
    assert not element_clusters.enable_for(_config(), environ)
    assert environ == {"TF_XLA_FLAGS": given} and not element_clusters.in_effect(environ)


def test_the_step_path_says_when_they_are_in_effect(monkeypatch):
    from keras_attnconv.models.step_compilation import describe_step_path

    monkeypatch.setattr("keras.backend.backend", lambda: "tensorflow")
    monkeypatch.setenv("TF_XLA_FLAGS", " ".join(FLAGS))
    assert describe_step_path(False, platform="cpu").endswith("; element-wise ops in XLA clusters)")
    assert describe_step_path(True, platform="cpu") == "XLA"  # a whole step under XLA has no clusters of its own
    monkeypatch.delenv("TF_XLA_FLAGS")
    assert "clusters" not in describe_step_path(False, platform="cpu")


def test_train_sets_them_before_tensorflows_runtime_starts(small_npz, tmp_path):
    # TensorFlow reads TF_XLA_FLAGS once, when its runtime starts (its first op or device query): set after that,
    # they change nothing. The child stops right after `enable_for`, saying whether TensorFlow had started.
    child = textwrap.dedent(
        f"""
        import sys
        from keras_attnconv import cli
        from keras_attnconv.models import element_clusters

        def enable_for(config, environ=None):
            started = element_clusters.tensorflow_started()
            print("started" if started else "not started", config.precision, config.model)
            sys.exit(0)

        element_clusters.enable_for = enable_for
        cli.main(["train", "--recipe", "quadratic", "--dataset", {small_npz!r}, "--precision", "mixed_bfloat16",
                  "--run-dir", {str(tmp_path / "run")!r}, "--export-dir", "none"])
        """
    )
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "not started mixed_bfloat16 quadratic", result.stdout
    assert not (tmp_path / "run").exists()


def test_tensorflow_has_started_once_it_ran_an_op_or_listed_its_devices():
    check = "from keras_attnconv.models.element_clusters import tensorflow_started as s; import tensorflow as tf"
    for statement, started in [("pass", False), ("tf.config.list_physical_devices()", True), ("tf.constant(1)", True)]:
        child = f"{check}; {statement}; print(s())"
        result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
        assert result.stdout.split()[-1] == str(started), (statement, result.stderr[-2000:])
