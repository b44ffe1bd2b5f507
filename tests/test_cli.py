"""The `attnconv` command: help without loading a framework, one-line errors with exit code 2,
no native start-up noise, and each command writing or printing what its library function returns.

The library functions behind the commands are specified in their own test files
(training, export, comparison, figures, conversion, benchmarks)."""

import argparse
import os
import re
import shutil
import subprocess
import sys

import pytest

from keras_attnconv import cli
from keras_attnconv.utils.ownership import MARKER


def run_cli(*args, **env):
    return subprocess.run(
        [sys.executable, "-m", "keras_attnconv.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def test_list_prints_our_and_the_papers_figures(capsys):
    assert cli.main(["list", "quadratic", "resnet18"]) == 0
    out = capsys.readouterr().out
    assert "| `quadratic` | SA quadratic emb. (Table 1) | 12.09M | 12.1M | 6.18B | 6.2B |" in out
    assert "| `resnet18` | ResNet18 (Table 1) | 11.17M | 11.2M | 1.11B | 1.1B |" in out


def test_list_takes_the_glob_patterns_of_list_models(capsys):
    from keras_attnconv.models import list_models

    assert cli.main(["list", "quadratic*", "resnet18", "quadratic"]) == 0
    listed = re.findall(r"^\| `([a-z0-9_]+)` \|", capsys.readouterr().out, re.MULTILINE)
    assert listed == [*list_models("quadratic*"), "resnet18"]  # a pattern's names in the zoo's order, each once
    assert cli.main(["list", "quadx*"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No model matches the pattern 'quadx*'" in err
    assert "Did you mean 'quadratic'" in err and "Received: models='quadx*'" in err


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage: attnconv" in capsys.readouterr().out


def test_help_and_argument_checks_load_no_subcommands_work():
    # `attnconv` imports what a subcommand works with only when it runs: --help and a rejected flag load the
    # library (`import keras_attnconv` registers its Keras classes) and the commands' settings, not the
    # benchmarks, figures, comparisons, data loaders, nor TF Serving's, TFDS's or ONNX's packages.
    script = (
        "import sys; from keras_attnconv import cli\n"
        "assert cli.main(['train', '--jit-compile', 'maybe']) == 2\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = eval(result.stdout.strip().splitlines()[-1])
    assert "keras_attnconv.layers" in loaded and "keras_attnconv.training.recipe" in loaded
    work = (
        "keras_attnconv.bench",
        "keras_attnconv.training.figures",
        "keras_attnconv.analysis.viz",
        "keras_attnconv.training.comparison",
        "keras_attnconv.training.numerics",
        "keras_attnconv.training.data",
        "keras_attnconv.training.input_pipeline",
        "tensorflow_serving",
        "tensorflow_datasets",
        "onnx",
        "tf2onnx",
    )
    assert [m for m in loaded if m.split(".")[0] in work or m.startswith(work)] == []
    assert "usage: attnconv" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train", "--jit-compile", "maybe"],
            "`jit_compile` must be true, false or \"auto\" .* Received: jit_compile='maybe'",
        ),
        (["train", "--learning-rate", "-1"], "Received: learning_rate=-1"),
        (["train", "--momentum", "1.5"], "Received: momentum=1.5"),
        (["train", "--seed", "x"], "Received: seed='x'"),
        (["train", "--download", "yes"], "Received: download='yes'"),
        (["train", "--epochs", "0"], "Received: epochs=0"),
        (["train", "--export-name", "../../x"], "never a path\\). Received: export_name='../../x'"),
        (  # the form it takes, shown
            ["train", "--model-overrides", "num_heads=4"],
            r"--model-overrides '\{num_layers = 2\}'. Received: model_overrides='num_heads=4'",
        ),
        (["train", "--recipe", "missing.toml"], "No recipe at 'missing.toml'"),
        # Named as the user gave it (`--dataset`), not as `--name`, the run's.
        (["train", "--dataset", "missing/folder"], "No image folder .*Received: dataset='missing/folder'"),
        (["train", "--dataset", "cifar11"], "Did you mean 'cifar10'.*Received: dataset='cifar11'"),
        (["export"], "give one of SOURCE .a training run or preset directory., --model NAME or --all. Received: none"),
        (["export", "run", "--all"], "give one of SOURCE.*Received: SOURCE='run', --all=True"),
        (["export", "--all", "--name", "x"], "--name names one export. Received: name='x'"),
        # Named as the command calls it (`--name`), not as the Python API does (`serving_name`).
        (["export", "--model", "quadratic_tiny", "--name", "../x"], "never a path\\). Received: name='../x'"),
        (["table1", "run", "--data-name", "d", "--data-file", "missing.npz"], "Received: data_file='missing.npz'"),
        (
            ["choices", "run", "--base", "base", "--data-name", "d", "--data-file", "missing.npz"],
            r"`data_file` must be a file to read and digest: 'missing.npz' cannot be read \(No such file",
        ),
        (["export", "--model", "../../x"], "Unknown model '../../x'.*Received: model='../../x'"),
        (
            ["export", "--model", "quadratic_tiny", "--compute-dtype", "bfloat17"],
            "Did you mean 'bfloat16'.*Received: compute_dtype='bfloat17'",
        ),
    ],
)
def test_errors_are_one_line_naming_the_value_with_exit_code_2(capsys, args, message):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err) and err.startswith(f"attnconv {args[0]}: error: ")


def test_a_malformed_recipe_names_the_file(tmp_path, capsys):
    recipe = tmp_path / "broken.toml"
    recipe.write_text("epochs = [\n")
    assert cli.main(["train", "--recipe", str(recipe)]) == 2
    assert f"The recipe '{recipe}' is not valid TOML" in capsys.readouterr().err


def test_an_unknown_model_fails_before_anything_is_written(tmp_path, capsys):
    assert (
        cli.main(
            [
                "train",
                "--model",
                "quadratik",
                "--runs-dir",
                str(tmp_path / "runs"),
                "--export-dir",
                str(tmp_path / "saved"),
            ]
        )
        == 2
    )
    assert "Did you mean 'quadratic'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_debug_shows_the_traceback():
    result = run_cli("--debug", "list", "quadratik")
    assert result.returncode != 0 and "Traceback (most recent call last)" in result.stderr
    quiet = run_cli("list", "quadratik")
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    assert "Received: models='quadratik'" in quiet.stderr  # the command's argument, `attnconv list [models]`


def test_no_native_start_up_noise_on_a_cpu_machine():
    result = run_cli("list", "resnet_tiny", TF_CPP_MIN_LOG_LEVEL="")
    assert result.returncode == 0 and "resnet_tiny" in result.stdout
    assert result.stderr == "", result.stderr


def test_a_reader_that_stops_reading_is_no_error():
    # `attnconv recipes | grep -q quadratic`, `attnconv list | head -3`: the pipe closes before the output is written.
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_attnconv.cli", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    process.stdout.close()
    assert process.wait(timeout=120) == 141
    assert process.stderr.read() == ""


def test_the_native_log_filter_drops_start_up_lines_and_keeps_the_rest(capfd):
    from keras_attnconv.utils.console import native_log_filter

    with native_log_filter():
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
        os.write(2, b"I0000 00:00:1795451018.238620    2360 cudart_stub.cc:31] Could not find cuda drivers\n")
        os.write(2, b"2026-12-07 13:31:54.357065: I tensorflow/core/util/port.cc:153] oneDNN custom operations\n")
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")  # LiteRT's, checking an export
        os.write(2, b"E0000 00:00:1795451018.238620    2360 some_op.cc:31] a real error\n")
        os.write(2, b"INFO: another notice of LiteRT's\n")
        os.write(2, b"a Python warning\n")
    assert capfd.readouterr().err == (
        "E0000 00:00:1795451018.238620    2360 some_op.cc:31] a real error\nINFO: another notice of LiteRT's\n"
        "a Python warning\n"
    )


@pytest.mark.skipif(shutil.which("attnconv") is None, reason="console script not on PATH")
def test_console_script_help():
    result = subprocess.run(["attnconv", "--help"], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert "list" in result.stdout


def _written_and_absent(out):
    lines = out.splitlines()
    return [line for line in lines if not line.startswith("not drawn: ")], [
        line for line in lines if line.startswith("not drawn: ")
    ]


def test_plot_writes_each_figure_of_a_run_or_a_preset_as_png_and_svg(tmp_path, capsys):
    from keras_attnconv import build_model, save_to_preset
    from keras_attnconv.training.run_directory import RunDirectory

    run = tmp_path / "run"
    RunDirectory(run).claim()  # a run directory of the package: its figures go into it
    model = build_model("quadratic_tiny", num_layers=1, hidden_dim=8, intermediate_dim=8)
    save_to_preset(model, run / "preset", metadata={"dataset": "cifar10_sample"})
    (run / "history.csv").write_text("epoch,loss,learning_rate\n0,2.0,0.1\n")
    names = ("training_curves", "attention_centers", "attention_maps_0", "attention_maps_1")
    assert cli.main(["plot", str(run), "--dpi", "40"]) == 0
    written, absent = _written_and_absent(capsys.readouterr().out)
    assert written == [str(run / "figures" / f"{name}.{suffix}") for name in names for suffix in ("png", "svg")]
    assert absent == [
        f"not drawn: centers_history: no centers_history.npz in {run} (recorded for quadratic and Gaussian heads)"
    ]
    assert all(open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for path in written[::2])
    assert cli.main(["plot", str(run / "preset"), "--output", str(tmp_path / "elsewhere"), "--dpi", "40"]) == 0
    written, _ = _written_and_absent(capsys.readouterr().out)
    assert written == [
        str(tmp_path / "elsewhere" / f"{name}.{suffix}") for name in names[1:] for suffix in ("png", "svg")
    ]
    preset_files = [MARKER, "config.json", "metadata.json", "model.weights.h5"]
    assert sorted(p.name for p in (run / "preset").iterdir()) == preset_files


def test_plot_of_a_directory_without_a_model_is_an_error(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path)]) == 2
    assert "neither a finished training run (with preset/) nor a preset" in capsys.readouterr().err


def test_convert_prints_the_conversion_error(capsys):
    assert cli.main(["convert", "--kernel-size", "3", "--size", "8"]) == 0
    out = capsys.readouterr().out
    assert "9 quadratic heads" in out
    relative = float(out.split("relative ")[1].split()[0])
    assert relative < 1e-4


def test_compare_with_an_unknown_model_fails_before_any_training(tmp_path, capsys):
    recipe = tmp_path / "tiny.toml"
    recipe.write_text("epochs = 1\n")
    assert (
        cli.main(
            [
                "compare",
                "--recipe",
                str(recipe),
                "--models",
                "quadratic_tiny,quadratic_spam_tiny",
                "--runs-dir",
                str(tmp_path / "runs"),
                "--output",
                str(tmp_path / "c.json"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "Did you mean 'quadratic_span_tiny'" in err and "Received: models='quadratic_spam_tiny'" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["convert", "--size", "0"], "Received: size=0"),
        (["convert", "--kernel-size", "5", "--size", "3", "--padding", "valid"], "at least 5 pixels.*Received: size=3"),
        (["train", "--seed", "-1"], "Received: seed=-1"),
        (["train", "--seed", "4294967296"], "Received: seed=4294967296"),
    ],
)
def test_more_bad_values_are_named_in_one_line(capsys, args, message):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err)


def test_paths_that_cannot_be_written_are_named_before_any_work(tmp_path, capsys, small_npz):
    (tmp_path / "file").write_text("")
    common = ["--model", "quadratic_tiny", "--dataset", small_npz, "--epochs", "1", "--jit-compile", "false"]
    cases = [
        (["train", *common, "--run-dir", str(tmp_path / "file" / "run"), "--export-dir", "none"], "run_dir"),
        (
            ["train", *common, "--run-dir", str(tmp_path / "run"), "--export-dir", str(tmp_path / "file" / "sm")],
            "export_dir",
        ),
        (["bench", "--quick", "--output", str(tmp_path / "file" / "bench.json")], "output"),
    ]
    for args, argument in cases:
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert f"Cannot write to {argument}=" in err and f"{tmp_path / 'file'} is a file" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no run, no export, no results


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, which refuses new files")
def test_a_folder_that_refuses_new_files_is_named_before_any_work_whatever_its_permission_bits(capsys, small_npz):
    # /proc's permission bits let root write (os.access says yes), yet it takes no new file: the check asks the
    # file system itself, so the run or benchmark does not end by failing to write what it measured.
    common = ["--model", "quadratic_tiny", "--dataset", small_npz, "--epochs", "1", "--export-dir", "none"]
    cases = [
        (["train", *common, "--run-dir", "/proc/attnconv-run"], "run_dir='/proc/attnconv-run'"),
        (["bench", "--suite", "steps", "--quick", "--output", "/proc/bench.json"], "output='/proc/bench.json'"),
    ]
    for args, named in cases:
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"Cannot write to {named}: /proc " in err, err


def test_an_override_of_what_the_dataset_decides_is_refused(tmp_path, capsys, small_npz):
    assert (
        cli.main(
            [
                "train",
                "--model",
                "quadratic_tiny",
                "--dataset",
                small_npz,
                "--model-overrides",
                "{image_size = 64}",
                "--run-dir",
                str(tmp_path / "run"),
                "--export-dir",
                "none",
            ]
        )
        == 2
    )
    assert "`image_size` comes from the dataset (8 for" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_long_message_keeps_what_was_received():
    message = cli._one_line(ValueError("x" * 2000 + " Received: value=42"))
    assert len(message) < 700 and message.endswith("Received: value=42")


@pytest.mark.parametrize(
    "args, unrecognized",
    [
        (["train", "--epoch", "0"], "--epoch 0"),  # not --epochs (values that fail at once where it was taken)
        (["export", "--mod", "nosuch"], "--mod"),  # nosuch is then its SOURCE
        (["compare", "--model", "nosuch"], "--model nosuch"),  # not --models
    ],
)
def test_an_abbreviated_option_is_not_taken_for_another(capsys, args, unrecognized):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unknown argument {unrecognized.split()[0]!r}" in err
    assert err.rstrip().endswith(f"Received: {unrecognized}")


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--epocs", "3"], r"^attnconv train: error: unknown argument '--epocs'. Did you mean '--epochs'"),
        (["export", "--export_dir", "x"], r"unknown argument '--export_dir'. Did you mean '--export-dir'"),
        (["--verbsoe"], r"^attnconv: error: unknown argument '--verbsoe'"),
    ],
)
def test_an_unknown_flag_is_one_line_with_the_commands_closest_flag(capsys, args, message):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["export", "--format", "onxx"],
            r"^attnconv export: error: argument --format: invalid choice: 'onxx' \(choose from 'saved_model', "
            r"'onnx', 'litert'\)\. Did you mean 'onnx'\? `attnconv export --help` lists the arguments\.$",
        ),
        (["trian"], r"^attnconv: error: argument COMMAND: invalid choice: 'trian' \(.*\)\. Did you mean 'train'"),
        (["bench", "--suite", "numeric"], r"^attnconv bench: error: .*'numeric' \(.*\)\. Did you mean 'numerics'\?"),
        (
            ["serve", "quadratic_tiny"],
            r"^attnconv serve: error: the following arguments are required: version\. `attnconv serve --help` lists",
        ),
    ],
)
def test_a_bad_or_missing_argument_is_one_line_and_a_value_not_among_the_choices_gets_the_closest(
    capsys, args, message
):
    with pytest.raises(SystemExit) as exit:
        cli.main(args)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err.strip()), err  # no usage block before it


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--recipe", ""], r"`recipe` must be a non-empty path. Received: recipe=''"),  # not "no recipe"
        # none means no export in `attnconv train`; it used to mean the default folder in export and serve.
        (["export", "--model", "quadratic_tiny", "--export-dir", "none"], r"means no export.*export_dir='none'"),
        (["serve", "quadratic_tiny", "1", "--export-dir", "None"], r"means no export.*export_dir='None'"),
        (["train", "--model", "null"], r"`model` must be a non-empty string. Received: model=None"),  # not `name`
        (["train", "--recipe", "quick", "--model", "null"], r"Received: model=None"),
        (["train", "--recipe", "quick", "--model", "quadratik"], r"Did you mean 'quadratic'.*model='quadratik'"),
        (["train", "--recipe", "quick", "--eval-split", "valid"], r"Did you mean 'validation'.*eval_split='valid'"),
        (
            [
                "train",
                "--strategy",
                "data_parallel",
                "--coordinator",
                "localhost",
                "--num-processes",
                "2",
                "--process-id",
                "0",
            ],
            r"`coordinator` must be .*host:port.*Received: coordinator='localhost'",
        ),
        (
            [
                "train",
                "--strategy",
                "data_parallel",
                "--coordinator",
                "localhost:99999",
                "--num-processes",
                "2",
                "--process-id",
                "0",
            ],
            r"port from 1 to 65535.*Received: coordinator='localhost:99999'",
        ),  # JAX would wait forever
    ],
)
def test_a_bad_recipe_model_or_coordinator_is_named_as_given(capsys, args, message):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err


def test_a_shortened_list_of_models_never_cuts_a_name(capsys):
    from keras_attnconv.models import list_models

    assert cli.main(["export", "--model", "quadratik"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Received: model='quadratik'" in err
    shown = err.split("Available: ")[1].split(" ... ")[0].split(", ")
    assert len(shown) < len(list_models()) and set(shown) <= set(list_models())


def test_plot_of_a_model_with_nothing_to_draw_says_so(tmp_path, capsys):
    from keras_attnconv import build_model, save_to_preset

    preset = save_to_preset(build_model("resnet_tiny"), tmp_path / "preset", metadata={"dataset": "cifar10_sample"})
    assert cli.main(["plot", str(preset), "--output", str(tmp_path / "figures")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Nothing to draw" in err and "has no attention heads" in err
    assert not (tmp_path / "figures").exists()


def test_plot_of_a_resnet_run_draws_its_curves_and_says_why_the_rest_is_absent(tmp_path, capsys):
    from keras_attnconv import build_model, save_to_preset
    from keras_attnconv.training.run_directory import RunDirectory

    run = tmp_path / "run"
    RunDirectory(run).claim()
    save_to_preset(build_model("resnet_tiny"), run / "preset", metadata={"dataset": "cifar10_sample"})
    (run / "history.csv").write_text("epoch,loss,val_loss\n0,2.0,2.1\n1,1.5,1.8\n")
    assert cli.main(["plot", str(run), "--dpi", "40"]) == 0
    written, absent = _written_and_absent(capsys.readouterr().out)
    assert written == [str(run / "figures" / f"training_curves.{suffix}") for suffix in ("png", "svg")]
    assert [line.split(":")[1].strip() for line in absent] == ["centers_history", "attention_centers", "attention_maps"]
    assert absent[-1] == "not drawn: attention_maps: ResNet resnet_tiny has no attention heads"


def test_plot_draws_the_windows_of_a_windowed_model(tmp_path, capsys):
    from keras_attnconv import build_model, save_to_preset

    model = build_model("absolute_learned_local_tiny", num_layers=1, hidden_dim=8, intermediate_dim=8)
    preset = save_to_preset(model, tmp_path / "preset", metadata={"dataset": "cifar10_sample"})
    assert cli.main(["plot", str(preset), "--output", str(tmp_path / "figures"), "--dpi", "40"]) == 0
    written, _ = _written_and_absent(capsys.readouterr().out)
    assert written == [
        str(tmp_path / "figures" / f"attention_maps_{i}.{suffix}") for i in (0, 1) for suffix in ("png", "svg")
    ]


def test_plot_never_replaces_a_users_file(tmp_path, capsys):
    from keras_attnconv import build_model, save_to_preset

    preset = save_to_preset(
        build_model("quadratic_tiny", num_layers=1, hidden_dim=8, intermediate_dim=8),
        tmp_path / "preset",
        metadata={"dataset": "cifar10_sample"},
    )
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "attention_centers.svg").write_text("mine")
    assert cli.main(["plot", str(preset), "--output", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "attention_centers.svg exists" in err and f"Received: output='{mine}'" in err
    assert [p.name for p in mine.iterdir()] == ["attention_centers.svg"] and (
        mine / "attention_centers.svg"
    ).read_text() == "mine"


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"epochs = 3 # \xff\xfe\n", "it is not UTF-8 text"),
        (b"model_overrides = " + b"[" * 50_000 + b"]" * 50_000 + b"\n", "it is nested too deeply"),
    ],
)
def test_a_recipe_that_cannot_be_parsed_is_named_in_one_line(tmp_path, capsys, content, reason):
    recipe = tmp_path / "bad.toml"
    recipe.write_bytes(content)
    assert cli.main(["train", "--recipe", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"The recipe '{recipe}' is not valid TOML: {reason}" in err


@pytest.mark.parametrize("flag", ["--name", "--run-dir", "--runs-dir", "--export-dir"])
@pytest.mark.parametrize(
    "value, message", [("a\0b", "cannot hold a NUL byte"), ("x" * 300, "has a name of 300 characters")]
)
def test_a_name_or_path_the_system_cannot_take_is_named_before_any_work(
    tmp_path, capsys, monkeypatch, flag, value, message
):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--model", "quadratic_tiny", flag, value]) == 2
    err = capsys.readouterr().err
    argument = flag[2:].replace("-", "_")
    assert err.count("\n") == 1 and f"`{argument}` {message}" in err
    assert list(tmp_path.iterdir()) == []


def test_outputs_are_checked_before_any_work(tmp_path, capsys, monkeypatch):
    from keras_attnconv import bench, build_model, save_to_preset
    from keras_attnconv.training import figures

    def no_work(*args, **kwargs):
        raise AssertionError("work began before the output was checked")

    monkeypatch.setattr(bench, "run_benchmark", no_work)
    monkeypatch.setattr(figures, "run_figures", no_work)
    preset = save_to_preset(
        build_model("quadratic_tiny", num_layers=1, hidden_dim=8, intermediate_dim=8), tmp_path / "preset"
    )
    (tmp_path / "file").write_text("mine")
    cases = [
        (["bench", "--output", ""], "`output` must be a non-empty path. Received: output=''"),  # not the default
        (["plot", str(preset), "--output", str(tmp_path / "file")], f"{tmp_path / 'file'} is a file"),
        (["plot", str(preset), "--output", "a\0b"], "`output` cannot hold a NUL byte"),
    ]
    for args, message in cases:
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert (tmp_path / "file").read_text() == "mine"


def test_compare_takes_epochs_0_as_given_not_as_absent(tmp_path, capsys):
    recipe = tmp_path / "tiny.toml"
    recipe.write_text("epochs = 1\n")
    assert (
        cli.main(
            [
                "compare",
                "--recipe",
                str(recipe),
                "--epochs",
                "0",
                "--models",
                "quadratic_tiny",
                "--runs-dir",
                str(tmp_path / "runs"),
                "--output",
                str(tmp_path / "c.json"),
            ]
        )
        == 2
    )
    assert "Received: epochs=0" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]


@pytest.mark.parametrize("text", ["nan", "2024", "true", "inf", "1e3"])
def test_a_name_or_path_on_the_command_line_is_the_text_given(tmp_path, monkeypatch, text):
    # TOML would read these as numbers or booleans: a run directory, a name or a dataset path is text.
    from keras_attnconv.training import workflow

    given = {}
    monkeypatch.setattr(workflow, "train_and_export", lambda config: given.setdefault("config", config) and {})
    assert cli.main(["train", "--run-dir", text, "--name", text, "--export-dir", text, "--epochs", "3"]) == 0
    config = given["config"]
    assert (config.run_dir, config.name, config.export_dir, config.epochs) == (text, text, text, 3)


def test_a_chart_needs_matplotlib_and_its_absence_keeps_the_results(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what a machine without it raises on import
    assert cli._write_chart("plot_comparison", {"rows": []}, str(tmp_path / "chart")) is False
    assert capsys.readouterr().err.startswith("no chart: ") and list(tmp_path.iterdir()) == []


def test_every_argument_of_every_command_says_what_it_is():
    parser = cli.build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    silent = [
        f"attnconv {name} {'/'.join(action.option_strings) or action.dest}"
        for name, command in commands.choices.items()
        for action in command._actions
        if not action.help and action.help != argparse.SUPPRESS
    ]
    assert silent == []
