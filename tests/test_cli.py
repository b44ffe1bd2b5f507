"""The `attnconv` command: help and listing work."""

import shutil
import subprocess

import pytest

from keras_attnconv import cli


def test_list_prints_the_position_scores(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("quadratic", "gaussian", "learned"):
        assert name in out


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage: attnconv" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("attnconv") is None, reason="console script not installed")
def test_console_script_help():
    result = subprocess.run(["attnconv", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert "list" in result.stdout
