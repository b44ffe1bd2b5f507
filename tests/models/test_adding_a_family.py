"""docs/architecture.md's walk, run as it stands: a position score and a model family added each in one place.

The walk's modules are written out of the package, imported in a process of their own (what they register
stays out of this one), and the new family then passes the model contract every family passes.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support import walk_modules

SUPPORT = Path(__file__).parents[1]


def test_the_walk_adds_a_score_and_a_family_each_in_one_place(tmp_path):
    modules = walk_modules()
    assert set(modules) == {
        "my_scores.py",
        "plain_cnn/config.py",
        "plain_cnn/model.py",
        "plain_cnn/configurations.py",
        "plain_cnn/__init__.py",
        "use.py",
    }
    for path, source in modules.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(source)
    contract = textwrap.dedent("""
        import runpy
        runpy.run_path("use.py")
        from support import MODEL_CHECKS, family_cases
        cases = family_cases("PlainCNN", shrink=lambda name: {"image_size": 8})
        assert [case.name for case in cases] == ["plain_cnn_small"]
        import pytest
        for check in MODEL_CHECKS.values():
            try:
                check(cases[0])
            except pytest.skip.Exception:  # a check this backend has not: XLA on PyTorch
                pass
        print("walk and contract passed")
    """)
    path = os.pathsep.join([str(tmp_path), str(SUPPORT), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", contract],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "walk and contract passed" in result.stdout
