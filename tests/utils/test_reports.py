"""Results files (`write_report`): each says what produced it, the package's revision and the libraries' versions."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_attnconv.utils import reports
from keras_attnconv.utils.reports import BACKEND_LIBRARIES, machine, package_revision, write_report


def backend_versions():
    """The running backend's libraries and their versions, as the backend's own modules give them."""
    import importlib

    return {name: importlib.import_module(name).__version__ for name in BACKEND_LIBRARIES[keras.backend.backend()]}


def test_a_results_file_records_the_package_revision_and_the_libraries_versions(tmp_path):
    results = {"settings": {"steps": 1}, "rows": [{"ms": 1.5}]}
    write_report(tmp_path / "r.json", results, "| table |")
    written = json.loads((tmp_path / "r.json").read_text())
    assert written == results  # what a suite returns is what it wrote
    assert written["package"] == package_revision() and set(written["package"]) == {"version", "commit"}
    assert written["libraries"] == {"keras": keras.__version__, "numpy": np.__version__, **backend_versions()}
    assert written["settings"] == {"steps": 1} and written["rows"] == [{"ms": 1.5}]
    assert (tmp_path / "r.md").read_text() == "| table |\n"


def test_the_versions_go_into_the_results_machine_record_as_far_as_it_lacks_them(tmp_path):
    recorded = machine()  # the backend and Keras' version, not the others
    write_report(tmp_path / "r.json", {"machine": recorded}, "")
    written = json.loads((tmp_path / "r.json").read_text())
    assert "libraries" not in written
    assert written["machine"] == {**recorded, "numpy": np.__version__, **backend_versions()}


def test_the_machine_record_names_the_compiler_flags_a_measurement_ran_with(monkeypatch):
    # TF_XLA_FLAGS (TensorFlow's clusters) and XLA_FLAGS change what a compiled step runs: a results file says so.
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_auto_jit=2")
    recorded = machine()
    assert recorded["compiler_flags"] == {"TF_XLA_FLAGS": "--tf_xla_auto_jit=2"}
    assert reports.machine_text(recorded).endswith("; TF_XLA_FLAGS='--tf_xla_auto_jit=2'")
    monkeypatch.delenv("TF_XLA_FLAGS")
    recorded = machine()
    assert recorded["compiler_flags"] == {} and reports.machine_text(recorded).endswith(")")


def test_a_record_with_every_version_is_kept_as_it_is_and_a_workers_record_is_never_changed(tmp_path):
    # A worker's description (`device_description`, on its own backend): nothing to add, and the worker's
    # versions stay, whatever this process runs on.
    device = {"backend": "jax", "keras": "3.0", "numpy": "1.0", "jax": "0.1", "jaxlib": "0.1", "device": "x"}
    results = {"device": device, "machine": {"backend": "jax", "keras": "3.0"}}
    write_report(tmp_path / "r.json", results, "")
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["device"] == device and written["machine"] == {"backend": "jax", "keras": "3.0"}
    assert set(written) == {"device", "machine", "package"}
    # One that lacks them gets the libraries of the backend it names, in a new dict (it may be shared).
    shared = {"backend": "jax", "keras": "3.0", "device": "x"}
    results = {"device": shared}
    write_report(tmp_path / "r.json", results, "")
    assert set(results["device"]) == {"backend", "keras", "device", "numpy", "jax", "jaxlib"}
    assert results["device"]["keras"] == "3.0" and "tensorflow" not in results["device"]
    assert shared == {"backend": "jax", "keras": "3.0", "device": "x"}


def test_a_file_written_again_names_the_code_that_wrote_it_last(tmp_path):
    earlier = {"package": {"version": "0.0.1", "commit": "0000000"}, "rows": []}
    write_report(tmp_path / "r.json", earlier, "")
    assert json.loads((tmp_path / "r.json").read_text())["package"] == package_revision()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or os.cpu_count() < 2, reason="needs CPU affinity and 2 CPUs")
def test_a_report_says_how_many_cpus_a_confined_process_could_use():
    # As `taskset -c 0 attnconv bench ...` runs it: the thread pools are sized by the usable CPUs, not the machine's.
    confined = subprocess.run(
        [sys.executable, "-c", "from keras_attnconv.utils.reports import usable_cpus; print(usable_cpus())"],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )
    assert confined.stdout.strip() == "1"
    machine = {"processor": "x86_64", "cpus": 2, "cpu": {"model": "AMD EPYC", "vector_units": "AVX2"}}
    assert reports.machine_text({**machine, "cpus_usable": 1}).startswith(
        "AMD EPYC, 2 CPUs, 1 of them usable by the process (bfloat16 units: none; vectors: AVX2)"
    )
    # All of them, or a file written before this was recorded: the machine's count alone.
    assert (
        reports.machine_text({**machine, "cpus_usable": 2})
        == reports.machine_text(machine)
        == ("AMD EPYC, 2 CPUs (bfloat16 units: none; vectors: AVX2)")
    )
    # Where the family and model numbers are recorded, beside the model name.
    numbered = {**machine, "cpu": {**machine["cpu"], "family": 25, "model_number": 17}}
    assert reports.machine_text(numbered).startswith("AMD EPYC (family 25, model 17), 2 CPUs (")
