"""``jit_compile="auto"`` takes the path `attnconv bench --suite steps` measured faster for a model on this machine."""

import json

import keras
import pytest

from keras_attnconv.models import build_model
from keras_attnconv.models import measured_step_paths as measured
from keras_attnconv.models.step_compilation import auto_source, resolve_jit_compile_for

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="the measured choice is between TensorFlow's two paths on a CPU"
)
SMALL = {"num_layers": 1, "hidden_dim": 8, "intermediate_dim": 8, "image_size": 8}


def small_model(**fields):
    return build_model("quadratic_tiny", seed=0, **{**SMALL, **fields})


@pytest.mark.parametrize("faster", [True, False])
def test_auto_takes_the_path_measured_faster_for_the_model(faster):
    model = small_model()
    rule = resolve_jit_compile_for(model)
    measured.record_measured_jit_compile(model, "float32", {faster: 1.0, not faster: 2.0})

    assert resolve_jit_compile_for(model) is faster and "measured faster" in auto_source(model)
    model.compile()
    assert model.jit_compile is faster
    assert resolve_jit_compile_for(model, "auto", "mixed_bfloat16") is rule  # another precision: unmeasured
    assert resolve_jit_compile_for(model, not faster) is (not faster)  # True and False still force a path


def test_a_record_holds_for_the_same_architecture_only():
    measured.record_measured_jit_compile(small_model(), "float32", {False: 1.0, True: 2.0})
    # Another name, class names or normalisation train the same step; another width does not.
    assert measured.measured_jit_compile(small_model(class_names=list("abcdefghij")), "float32") is False
    assert measured.measured_jit_compile(small_model(hidden_dim=16), "float32") is None


def test_a_record_is_of_the_machine_it_was_measured_on(monkeypatch):
    model = small_model()
    measured.record_measured_jit_compile(model, "float32", {False: 1.0, True: 2.0})
    monkeypatch.setattr(
        measured,
        "cpu_capabilities",
        lambda: {"model": "another CPU", "flags": frozenset({"avx2"}), "bfloat16_units": None},
    )
    assert measured.measured_jit_compile(model, "float32") is None


def test_records_live_in_the_package_cache_and_an_unreadable_file_is_no_record(package_cache):
    model = small_model()
    measured.record_measured_jit_compile(model, "float32", {False: 1.0, True: 2.0})
    path = package_cache / "step_paths" / "step_paths.json"
    (record,) = json.loads(path.read_text())["records"].values()
    assert (record["model"], record["jit_compile"], record["step_ms"]) == (
        "quadratic_tiny",
        False,
        {"graph": 1000.0, "xla": 2000.0},
    )
    path.write_text("{not json")
    assert measured.measured_jit_compile(model, "float32") is None
    assert "the rule" in auto_source(model)
    measured.record_measured_jit_compile(model, "float32", {True: 1.0, False: 2.0})  # rewritten whole
    assert measured.measured_jit_compile(model, "float32") is True
