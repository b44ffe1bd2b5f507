"""`--strategy multi_worker` for real: two worker processes on 127.0.0.1 (TF_CONFIG) train the tiny model;
only the chief writes the run directory and exports; killing a worker and restarting both resumes from
the chief's last backup."""

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from support import tensorflow_backend_only

pytest.importorskip("tensorflow")
pytestmark = tensorflow_backend_only("tf.distribute's MultiWorkerMirroredStrategy")

SMALL_MODEL = "{num_layers = 1, hidden_dim = 16, intermediate_dim = 16}"


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_workers(small_npz, run, exports, ports, epochs):
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    command = [
        sys.executable,
        "-m",
        "keras_attnconv.cli",
        "train",
        "--model",
        "quadratic_tiny",
        "--model-overrides",
        SMALL_MODEL,
        "--dataset",
        small_npz,
        "--epochs",
        str(epochs),
        "--batch-size",
        "20",
        "--strategy",
        "multi_worker",
        "--jit-compile",
        "false",
        "--verbose",
        "0",
        "--run-dir",
        str(run),
        "--export-dir",
        str(exports),
    ]
    workers = []
    for index in range(len(ports)):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        env = {**os.environ, "TF_CONFIG": tf_config, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
        workers.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return workers


def test_two_workers_train_resume_after_a_kill_and_only_the_chief_writes(small_npz, tmp_path):
    run, exports, epochs = tmp_path / "run", tmp_path / "saved_models", 3
    chief, worker = start_workers(small_npz, run, exports, free_ports(2), epochs)
    deadline = time.time() + 300
    while not (run / "backup" / "latest.json").exists():
        assert chief.poll() is None and worker.poll() is None, chief.stderr.read() + worker.stderr.read()
        assert time.time() < deadline, "the first epoch never finished"
        time.sleep(0.05)
    worker.send_signal(signal.SIGKILL)  # one worker dies; the chief cannot go on without it
    worker.wait()
    chief.send_signal(signal.SIGKILL)
    chief.wait()
    assert not (run / "metrics.json").exists(), "the cluster must have been killed before it finished"
    saved_epoch = json.loads((run / "backup" / "latest.json").read_text())["epoch"]

    restarted = start_workers(small_npz, run, exports, free_ports(2), epochs)
    outputs = [process.communicate(timeout=600) for process in restarted]
    for process, (out, err) in zip(restarted, outputs):
        assert process.returncode == 0, out + err
        assert f"from epoch {saved_epoch}/{epochs}" in err  # both resumed from the chief's backup
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and metrics["optimizer_steps"] == epochs * 160 // 20
    with open(run / "history.csv") as f:
        logged_epochs = [int(row["epoch"]) for row in csv.DictReader(f)]
    assert logged_epochs == sorted(set(logged_epochs)) and logged_epochs[-1] == epochs - 1  # one writer
    assert sorted(p.name for p in (exports / "quadratic_tiny").iterdir()) == ["1"]  # the chief alone exported
    assert json.loads(outputs[0][0])["export"] and json.loads(outputs[1][0])["export"] is None
