"""Shared fixtures: quiet TensorFlow logs, reset Keras state between tests.

Helper functions shared by tests are in support.py (``from support import ...``).
"""

import os
import subprocess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# JAX's partitionable threefry takes ~7 s to compile a dropout mask of a few hundred numbers on the CPU,
# the classic one 0.5 s; the tests need a seeded stream, not a shardable one.
os.environ.setdefault("JAX_THREEFRY_PARTITIONABLE", "0")
# XLA's CPU code without LLVM's optimisations (here and in the tests' subprocesses, which inherit it): the same
# HLO programs, fused as a user's, compile in ~60% of the time, and compiling is most of what the tests' tiny
# models cost under XLA (the model contract's XLA fit steps: 88 -> 63 s; on a quiet 2-core AVX2 EPYC the
# TensorFlow pass 1,187 -> 1,025 s, the JAX pass 582 -> 367 s).
# A user's own optimisation level is kept. Far centers' scores of ~-1e10, which that code rounds otherwise, have
# their peak at an exact 0 (`shift_geometry.squares_from_nearest`): their tests pass in either code.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.register_assert_rewrite("support")  # detailed assertion messages from the shared checks too


def pytest_collection_modifyitems(config, items):
    # The README's second pass re-runs the layers, models and training runs on JAX for what differs there: a test
    # marked backend_independent (plain Python, files, counts) checked on TensorFlow would only cost CI time again.
    if keras.backend.backend() == "tensorflow":
        return
    skip = pytest.mark.skip(reason="backend_independent: the TensorFlow pass checks it")
    for item in items:
        if item.get_closest_marker("backend_independent"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    keras.utils.set_random_seed(1234)
    yield
    keras.mixed_precision.set_dtype_policy("float32")
    keras.backend.clear_session(free_memory=False)  # the gc.collect() would cost ~0.3 s a test


@pytest.fixture(params=["mixed_float16", "mixed_bfloat16"])
def mixed_policy(request):
    """Runs the test under each mixed precision policy, restoring float32 after."""
    keras.mixed_precision.set_dtype_policy(request.param)
    yield request.param
    keras.mixed_precision.set_dtype_policy("float32")


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB file system of its own (tmpfs), where the test may fill the disk for real."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.fixture(scope="session")
def small_npz(tmp_path_factory):
    """200 real CIFAR-10 images at 8x8 (center crop) in train/test splits, as a dataset .npz path."""
    from keras_attnconv.training.data import load_arrays

    x, y = load_arrays("cifar10_sample", "train")
    path = tmp_path_factory.mktemp("data") / "small.npz"
    np.savez(path, x_train=x[:160, 12:20, 12:20], y_train=y[:160], x_test=x[160:200, 12:20, 12:20], y_test=y[160:200])
    return str(path)


@pytest.fixture(scope="session")
def jax_without_tensorflow(tmp_path_factory):
    """Environment variables for a subprocess on JAX where TensorFlow and TensorBoard cannot be imported.

    A package directory first on the path whose `tensorflow` and `tensorboard` raise
    ModuleNotFoundError on import, as a missing package does. The GPU machine lacks TensorFlow but
    has TensorBoard, which cannot write Keras' logs without it; hiding both also covers a bare JAX
    install.
    """
    pytest.importorskip("jax")
    blocked = tmp_path_factory.mktemp("without_tensorflow")
    for name in ("tensorflow", "tensorboard"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\")\n")
    path = os.pathsep.join(filter(None, [str(blocked), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": path}


@pytest.fixture
def validation_counts(monkeypatch):
    """How many configs were validated and how many models built since the fixture started."""
    counted = {"validations": 0, "builds": 0}
    from keras_attnconv.models import ClassifierConfig, ImageClassifier

    validate, construct = ClassifierConfig.__post_init__, ImageClassifier.__init__

    def counting_validate(self):
        counted["validations"] += 1
        validate(self)

    def counting_construct(self, *args, **kwargs):
        counted["builds"] += 1
        construct(self, *args, **kwargs)

    monkeypatch.setattr(ClassifierConfig, "__post_init__", counting_validate)
    monkeypatch.setattr(ImageClassifier, "__init__", counting_construct)
    return counted
