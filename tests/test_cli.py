"""The `attnconv` command: help and the model listing."""

import shutil
import subprocess

import pytest

from keras_attnconv import cli


def test_list_prints_our_and_the_papers_figures(capsys):
    assert cli.main(["list", "quadratic", "resnet18"]) == 0
    out = capsys.readouterr().out
    assert "| `quadratic` | SA quadratic emb. (Table 1) | 12.09M | 12.1M | 6.18B | 6.2B |" in out
    assert "| `resnet18` | ResNet18 (Table 1) | 11.17M | 11.2M | 1.11B | 1.1B |" in out


def test_list_rejects_unknown_models():
    with pytest.raises(ValueError, match="Did you mean 'quadratic'"):
        cli.main(["list", "quadratik"])


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage: attnconv" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("attnconv") is None, reason="console script not on PATH")
def test_console_script_help():
    result = subprocess.run(["attnconv", "--help"], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert "list" in result.stdout
