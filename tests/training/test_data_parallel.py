"""`--strategy data_parallel` (Keras' distribution API on JAX): two simulated devices train as one device does
with the same global batch; two processes on 127.0.0.1 (JAX's coordinator), one killed, restart with the same
command and finish as an uninterrupted run; bad input is named before anything is written."""

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support import tensorflow_backend_only

from keras_attnconv.training.distribution import (
    LOCATIONS_VARIABLE,
    locations_split_collectives,
    release_numbers,
    trace_alike_in_every_process,
)
from keras_attnconv.training.fit import train
from keras_attnconv.training.input_pipeline import ArrayBatches
from keras_attnconv.training.plan import check_last_batch
from keras_attnconv.training.recipe import TrainConfig, load_recipe

pytest.importorskip("jax")

TINY_MODEL = "{num_layers = 1, hidden_dim = 8, intermediate_dim = 8}"
EPOCHS = 3


def train_command(small_npz, run, *extra):
    """`attnconv train` of a tiny model: 3 epochs of 2 steps of a global batch of 20, no export."""
    return [
        "train",
        "--model",
        "quadratic_tiny",
        "--model-overrides",
        TINY_MODEL,
        "--dataset",
        small_npz,
        "--epochs",
        str(EPOCHS),
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "20",
        "--verbose",
        "0",
        "--run-dir",
        str(run),
        "--export-dir",
        "none",
        *extra,
    ]


def history(run):
    with open(Path(run) / "history.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def backup_arrays(run):
    """The last backup's weights and optimizer variables, in order."""
    state = Path(run) / "backup" / json.loads((Path(run) / "backup" / "latest.json").read_text())["directory"]
    arrays = []
    for name in ("model.npz", "optimizer.npz"):
        with np.load(state / name) as saved:
            arrays += [saved[f"v{i}"] for i in range(len(saved.files))]
    return arrays


def assert_same_run(found, expected):
    """Two runs with the same global batches: the same losses and weights, within float32 rounding."""
    found_history, expected_history = history(found), history(expected)
    assert [row["epoch"] for row in found_history] == [row["epoch"] for row in expected_history]
    for a, b in zip(found_history, expected_history):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    for a, b in zip(backup_arrays(found), backup_arrays(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def jax_env(base, devices=1):
    # The CPU as `devices` devices: XLA's flag, read when JAX starts.
    return {**base, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def one_device_run(small_npz, tmp_path_factory, jax_without_tensorflow):
    """The reference: the same command on one device, no strategy."""
    run = tmp_path_factory.mktemp("one_device") / "run"
    result = subprocess.run(
        [sys.executable, "-m", "keras_attnconv.cli", *train_command(small_npz, run)],
        capture_output=True,
        text=True,
        timeout=300,
        env=jax_env(jax_without_tensorflow),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def test_two_devices_train_as_one_with_the_same_global_batch(
    small_npz, tmp_path, one_device_run, jax_without_tensorflow
):
    odd_batch = train_command(small_npz, tmp_path / "odd", "--batch-size", "15", "--strategy", "data_parallel")
    two_devices = train_command(small_npz, tmp_path / "run", "--strategy", "data_parallel")
    script = textwrap.dedent(f"""
        import sys
        from keras_attnconv.cli import main

        # A global batch the 2 devices cannot share: refused, naming it, before anything is written.
        assert main({odd_batch!r}) == 2
        sys.exit(main({two_devices!r}))
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=jax_env(jax_without_tensorflow, devices=2),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "divide evenly across the 2 replicas of the 'data_parallel' strategy" in result.stderr
    assert "Received: batch_size=15" in result.stderr and not (tmp_path / "odd").exists()
    summary = json.loads(result.stdout[result.stdout.index("{\n") :])
    assert summary["replicas"] == 2 and summary["optimizer_steps"] == EPOCHS * 2
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["replicas"] == 2
    assert json.loads((one_device_run / "metrics.json").read_text())["replicas"] == 1
    assert_same_run(tmp_path / "run", one_device_run)
    assert (tmp_path / "run" / "preset" / "metadata.json").exists()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The first start of each process: the CLI, with process 0 SIGKILLed once its second epoch is backed up.
KILL_THE_CHIEF = """
import os, signal, sys
import jax
from keras_attnconv import cli
from keras_attnconv.training import callbacks

real = callbacks.ResumableBackup.on_epoch_end

def die_after_the_second_backup(self, epoch, logs=None):
    real(self, epoch, logs)
    if epoch == 1 and jax.process_index() == 0:
        os.kill(os.getpid(), signal.SIGKILL)

callbacks.ResumableBackup.on_epoch_end = die_after_the_second_backup
sys.exit(cli.main(sys.argv[1:]))
"""


def start_processes(command, env, count=2, script=None):
    port = free_port()
    processes = []
    for index in range(count):
        argv = [
            *command,
            "--coordinator",
            f"127.0.0.1:{port}",
            "--num-processes",
            str(count),
            "--process-id",
            str(index),
        ]
        program = ["-c", script] if script else ["-m", "keras_attnconv.cli"]
        # A process group of its own: a process that is stopped takes whatever it started with it.
        processes.append(
            subprocess.Popen(
                [sys.executable, *program, *argv],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    return processes


def stop(processes):
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def test_two_processes_killed_and_restarted_finish_as_an_uninterrupted_run(
    small_npz, tmp_path, one_device_run, jax_without_tensorflow
):
    run = tmp_path / "run"
    command, env = train_command(small_npz, run, "--strategy", "data_parallel"), jax_env(jax_without_tensorflow)
    chief, worker = start_processes(command, env, script=KILL_THE_CHIEF)
    try:
        chief.wait(timeout=240)
        assert chief.returncode == -signal.SIGKILL, chief.stderr.read()[-3000:]
    finally:  # process 1 is left waiting for its partner in the next step (or JAX's coordinator ends it)
        stop([chief, worker])
    assert not (run / "metrics.json").exists()
    assert json.loads((run / "backup" / "latest.json").read_text())["epoch"] == 2

    restarted = start_processes(command, env)  # the same command, unchanged
    try:
        outputs = [process.communicate(timeout=240) for process in restarted]
    finally:
        stop(restarted)
    for process, (out, err) in zip(restarted, outputs):
        assert process.returncode == 0, err[-3000:]
        assert f"from epoch 2/{EPOCHS}" in err  # both resumed from process 0's backup
        assert json.loads(out[out.index("{\n") :])["replicas"] == 2
    assert json.loads((run / "metrics.json").read_text())["replicas"] == 2
    assert_same_run(run, one_device_run)  # only process 0 wrote it: one row per epoch, the same figures


@tensorflow_backend_only("it checks the refusal on TensorFlow")
def test_data_parallel_needs_the_jax_backend(small_npz, tmp_path):
    config = TrainConfig(
        model="quadratic_tiny",
        dataset=small_npz,
        epochs=1,
        batch_size=20,
        verbose=0,
        export_dir=None,
        run_dir=str(tmp_path / "run"),
        strategy="data_parallel",
    )
    with pytest.raises(ValueError, match="Keras' distribution API on the JAX backend.*strategy='data_parallel'"):
        train(config)
    assert not (tmp_path / "run").exists()


def test_the_last_evaluation_batch_must_divide_across_the_replicas():
    config = TrainConfig(batch_size=20, strategy="data_parallel")
    check_last_batch(config, 40 + 6, "test", replicas=2)  # a last batch of 6: 3 images a device
    with pytest.raises(
        ValueError,
        match=r"last batch of 6, which does not divide across the 4 replicas.*"
        r"Received: batch_size=20",
    ):
        check_last_batch(config, 46, "test", replicas=4)


def test_the_processes_slices_make_the_global_batch():
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (50, 8, 8, 3), dtype=np.uint8), np.arange(50)
    options = {"batch_size": 20, "augment": True, "shuffle": True, "seed": 3}
    whole = ArrayBatches(images, labels, **options)
    shards = [ArrayBatches(images, labels, shard=(index, 2), **options) for index in range(2)]
    for batches in (whole, *shards):
        batches.epoch = 1
    for index in range(len(whole)):  # the last batch too: 10 images, 5 a process
        parts = [shard[index] for shard in shards]
        np.testing.assert_array_equal(np.concatenate([part[0] for part in parts]), whole[index][0])
        np.testing.assert_array_equal(np.concatenate([part[1] for part in parts]), whole[index][1])
    with pytest.raises(ValueError, match=r"Received: shard=\(0, 3\), batch_size=20"):
        ArrayBatches(images, labels, shard=(0, 3), batch_size=20)


def test_the_issue_spelling_of_a_package_recipe_is_that_recipe():
    assert load_recipe("training/recipes/quick.toml") == load_recipe("quick")


@tensorflow_backend_only("it checks the refusal of data_parallel on TensorFlow")
def test_the_process_arguments_are_checked_before_anything_runs(tmp_path, capsys):
    from keras_attnconv import cli
    from keras_attnconv.training.distribution import initialize_processes

    run = ["train", "--recipe", "quick", "--run-dir", str(tmp_path / "run")]
    assert cli.main([*run, "--coordinator", "127.0.0.1:1234"]) == 2  # the default strategy has one process
    assert "join the processes of a --strategy data_parallel run" in capsys.readouterr().err
    assert cli.main([*run, "--strategy", "data_parallel"]) == 2  # this test process runs TensorFlow
    assert "Received: strategy='data_parallel'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="num_processes, process_id missing"):
        initialize_processes("127.0.0.1:1234")
    with pytest.raises(ValueError, match=r"Received: process_id=2, num_processes=2"):
        initialize_processes("127.0.0.1:1234", num_processes=2, process_id=2)
    with pytest.raises(ValueError, match=r"`num_processes` must be a whole number. Received: num_processes='two'"):
        initialize_processes("127.0.0.1:1234", num_processes="two", process_id=0)
    assert initialize_processes() == 1  # nothing to join: one process


#: Two processes sum a batch split between them (an all-reduce), each tracing the sum from its own line of
#: Python. Under JAX 0.12.1 on CPUs, without `trace_alike_in_every_process`, both waited in it forever.
TRACED_FROM_DIFFERENT_LINES = """
import sys
import numpy as np
from keras_attnconv.training.distribution import initialize_processes
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# start_processes' arguments: --coordinator ADDRESS --num-processes 2 --process-id INDEX
address, count, index = sys.argv[2], int(sys.argv[4]), int(sys.argv[6])
initialize_processes(address, num_processes=count, process_id=index)
mesh = Mesh(np.array(jax.devices()), ("batch",))
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))
rows = jax.make_array_from_process_local_data(
    NamedSharding(mesh, PartitionSpec("batch")), np.full((4,), index + 1.0, np.float32)
)
if index == 0:
    result = total(rows)  # process 0 traces the sum from this line,
else:
    result = total(rows)  # the other from this one
print(float(result), jax.config.jax_traceback_in_locations_limit)
"""


def test_processes_that_trace_a_collective_from_different_lines_meet_in_it(jax_without_tensorflow):
    env = {key: value for key, value in jax_env(jax_without_tensorflow).items() if key != LOCATIONS_VARIABLE}
    processes = start_processes([], env, script=TRACED_FROM_DIFFERENT_LINES)
    try:
        outputs = [process.communicate(timeout=60) for process in processes]
    finally:
        stop(processes)
    import jax

    split = locations_split_collectives(jax.__version__, "cpu", 2)
    for process, (out, err) in zip(processes, outputs):
        assert process.returncode == 0, err[-3000:]
        total, limit = out.splitlines()[-1].split()  # after gloo's own line
        assert float(total) == 4 * 1.0 + 4 * 2.0  # each process' four rows, summed across both
        assert (limit == "0") is split  # traced without source locations where JAX needs it, only there


@pytest.mark.parametrize(
    "version, platform, processes, split",
    [
        ("0.12.1", "cpu", 2, True),  # measured: hung without the setting, trained with it
        ("0.12.2.dev20261201", "cpu", 4, True),
        ("0.13.0", "cpu", 2, True),
        ("0.12.0.1", "cpu", 2, False),  # measured: trained from different lines
        ("0.10.2", "cpu", 2, False),
        ("0.12.1", "gpu", 2, False),  # NCCL's collectives: not measured
        ("0.12.1", "cpu", 1, False),
    ],
)
def test_which_runs_need_the_same_locations_in_every_process(version, platform, processes, split):
    assert locations_split_collectives(version, platform, processes) is split


def test_release_numbers_stop_at_the_first_part_that_is_not_a_number():
    assert release_numbers("0.12.0.1") == (0, 12, 0, 1)
    assert release_numbers("0.13.0.dev20261201") == (0, 13, 0)
    assert release_numbers("0.12.0.1") < (0, 12, 1) <= release_numbers("0.12.1")


def test_a_users_own_locations_setting_stands_and_is_warned_of(monkeypatch):
    import jax

    # A CPU under 0.12.1, without starting JAX's backend in this process (its threads would make every later
    # test's subprocess fork warn).
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    monkeypatch.setattr(jax, "__version__", "0.12.1")
    before = jax.config.jax_traceback_in_locations_limit
    try:
        jax.config.update("jax_traceback_in_locations_limit", 10)
        with pytest.warns(UserWarning, match=rf"Received: {LOCATIONS_VARIABLE}='10', 2 processes, JAX 0.12.1"):
            assert trace_alike_in_every_process(2, environ={LOCATIONS_VARIABLE: "10"}) is False
        assert jax.config.jax_traceback_in_locations_limit == 10  # the user's value, unchanged
        assert trace_alike_in_every_process(2, environ={}) is True
        assert jax.config.jax_traceback_in_locations_limit == 0
        assert trace_alike_in_every_process(1, environ={}) is False  # one process: nothing to meet
    finally:
        jax.config.update("jax_traceback_in_locations_limit", before)
