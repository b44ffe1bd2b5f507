"""Specifications of the GPU machine's training script: each run's recipe, changed settings and directory."""

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "training/gpu/train_recipes.sh"
# A `python3` that records each command it is given and, for `train`, makes the run directory it names.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
args=("$@")
for i in "${!args[@]}"; do
    if [ "${args[$i]}" = "--run-dir" ]; then
        mkdir -p "${args[$((i + 1))]}" && touch "${args[$((i + 1))]}/history.csv"
    fi
done
"""


@pytest.mark.parametrize("side_by_side", [False, True])
def test_each_run_trains_its_recipe_with_its_changes_in_a_directory_named_by_them(tmp_path, side_by_side):
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out), "CALLS": str(tmp_path / "calls")}
    runs = ["quadratic_fast", "quadratic_fast --cutout 16 --label-smoothing 0.1"]
    options = ["--side-by-side"] if side_by_side else []
    subprocess.run(["bash", str(SCRIPT), *options, "600", *runs], cwd=tmp_path, env=env, check=True)
    calls = (tmp_path / "calls").read_text().splitlines()
    trained = sorted(call for call in calls if call.startswith("-m keras_attnconv.cli train"))
    data = "--dataset /tmp/cifar10.npz"
    assert trained == [
        f"-m keras_attnconv.cli train --recipe quadratic_fast --cutout 16 --label-smoothing 0.1 {data} "
        "--run-dir runs/quadratic_fast-cutout-16-label-smoothing-0.1 --verbose 2",
        f"-m keras_attnconv.cli train --recipe quadratic_fast {data} --run-dir runs/quadratic_fast --verbose 2",
    ]
    assert sorted(call for call in calls if "cli plot" in call) == [
        "-m keras_attnconv.cli plot runs/quadratic_fast",
        "-m keras_attnconv.cli plot runs/quadratic_fast-cutout-16-label-smoothing-0.1",
    ]
    for name in ("quadratic_fast", "quadratic_fast-cutout-16-label-smoothing-0.1"):
        with tarfile.open(out / f"{name}.tgz") as packed:
            assert f"{name}/history.csv" in packed.getnames()
