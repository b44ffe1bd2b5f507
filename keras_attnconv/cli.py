"""The `attnconv` command line."""

import argparse
import contextlib
import os
import shlex
import sys


def _check_models(names, argument):
    """Each of `names` a registered model, else the registry's error, naming the command's own `argument`."""
    from keras_attnconv.models import get_model_card

    for name in names:
        get_model_card(name, argument=argument)


def _models_matching(arguments, argument):
    """Each of `arguments`, a model name or a glob pattern as `list_models` takes (``'quadratic*'``), as names.

    The names in the order given, a pattern's in the zoo's order, each once. A
    pattern that matches nothing is an error naming it, as an unknown name is.
    """
    from keras_attnconv.models import list_models
    from keras_attnconv.utils.checks import did_you_mean

    names = []
    for given in arguments:
        if not any(character in given for character in "*?["):  # fnmatch's wildcards, as list_models takes them
            _check_models([given], argument)
            matches = [given]
        else:
            matches = list_models(given)
            if not matches:
                plain = given.translate(str.maketrans("", "", "*?[]"))
                raise ValueError(
                    f"No model matches the pattern {given!r}.{did_you_mean(plain, list_models())} "
                    f"`attnconv list` names every model. Received: {argument}={given!r}"
                )
        names += [name for name in matches if name not in names]
    return names


def _list(args):
    from keras_attnconv.models.summary import markdown_table, model_rows

    names = _models_matching(args.models, "models")
    print(markdown_table(model_rows(names or None, recount=args.recount)))
    print(
        "\nFLOPs per 32x32 image, 2 per multiply-add. 'weights' counts products with weight kernels "
        "(convolutions, Dense, attention projections), the convention of the paper's Table 1; "
        "'with attention' adds the attention scores and the probability-weighted sums."
    )
    return 0


def _recipes(args):
    from keras_attnconv.training.recipe import RECIPES_DIR, recipe_rows

    print("| recipe | model | dataset | epochs | paper |\n|---|---|---|---|---|")
    for row in recipe_rows():
        print("| {recipe} | `{model}` | {dataset} | {epochs} | {paper} |".format(**row))
    print(f"\nattnconv train --recipe NAME trains one; the files are in {RECIPES_DIR}.")
    return 0


def _describe_default(field):
    import dataclasses

    if field.default_factory is not dataclasses.MISSING:
        return repr(field.default_factory())
    return repr(field.default)


def _parse_value(text, textual=False):
    """A command-line value as a TOML literal (3, 0.1, true, "x", {a = 1}); bare words stay strings; none is None.

    A `textual` field's value (a name, a path) is the text as given: a run
    directory named 2024, nan or true is a name, not a number or a boolean.
    """
    import tomllib

    from keras_attnconv.utils.checks import none_word

    if none_word(text) is None:
        return None
    if textual:
        return text
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def _train(args):
    import dataclasses
    import json

    from keras_attnconv.training.recipe import TrainConfig, load_recipe

    overrides = {
        f.name: _parse_value(getattr(args, f.name), textual=f.type in (str, "str", "str | None"))
        for f in dataclasses.fields(TrainConfig)
        if getattr(args, f.name) is not None
    }
    if not sys.stdout.isatty():
        overrides.setdefault("verbose", 2)  # a log file gets one line per epoch, not progress-bar redraws
    if args.recipe is not None:  # --recipe '' is a bad name, not the absence of a recipe
        config = load_recipe(args.recipe, **overrides)
    else:
        model = overrides.get("model", "quadratic")  # a bad one (--model null) is named by the model's own check
        config = TrainConfig.from_dict(
            {"name": model if isinstance(model, str) else "quadratic", **overrides}, source="command-line"
        )
    processes = {"coordinator": args.coordinator, "num_processes": args.num_processes, "process_id": args.process_id}
    if config.strategy == "data_parallel" or any(value is not None for value in processes.values()):
        _join_processes(config.strategy, processes)
    from keras_attnconv.models import element_clusters

    element_clusters.enable_for(config)  # before TensorFlow's runtime starts, which reads the flags once
    from keras_attnconv.training.workflow import train_and_export  # after the checks: this loads Keras

    metrics = train_and_export(config)
    summary = {
        "published": _published(metrics),
        **{
            k: metrics.get(k)
            for k in (
                "run_dir",
                "eval_split",
                "eval_accuracy",
                "best_val_accuracy",
                "train_images_per_second",
                "optimizer_steps",
                "replicas",
                "export",
            )
        },
    }
    print(json.dumps(summary, indent=2))
    return 0


def _published(metrics):
    """Which weights the run's preset (and its export) hold, with their accuracy: the best epoch's, not the last's."""
    from keras_attnconv.models.presets import load_preset_metadata

    if not metrics.get("preset") or not metrics.get("chief", True):  # a worker's preset was in its scratch folder
        return None
    metadata = load_preset_metadata(metrics["preset"])
    return {
        "weights": metadata["weights"],
        "eval_accuracy": metadata["metrics"]["eval_accuracy"],
        "preset": metrics["preset"],
    }


def _join_processes(strategy, processes):
    """Joins the other processes of a JAX run before anything computes (JAX allows it only then)."""
    from keras_attnconv.training.distribution import check_coordinator, check_strategy, initialize_processes

    if strategy != "data_parallel":
        given = ", ".join(f"{name}={value!r}" for name, value in processes.items() if value is not None)
        raise ValueError(
            f"--coordinator, --num-processes and --process-id join the processes of a "
            f"--strategy data_parallel run (JAX); the strategy is {strategy!r}. Received: {given}"
        )
    if processes["coordinator"] is not None:
        check_coordinator(processes["coordinator"])  # a typo is named on any backend, before the backend's own checks
    check_strategy(strategy)
    initialize_processes(**processes)


def _export(args):
    from keras_attnconv.export.exporter import export_registered, paper_configurations
    from keras_attnconv.export.root import check_serving_name
    from keras_attnconv.training.workflow import export_source

    given = {"SOURCE": args.source, "--model": args.model, "--all": args.all or None}
    if sum(value is not None for value in given.values()) != 1:
        raise ValueError(
            "give one of SOURCE (a training run or preset directory), --model NAME or --all. Received: "
            + (", ".join(f"{k}={v!r}" for k, v in given.items() if v is not None) or "none of them")
        )
    if args.all and args.name is not None:
        raise ValueError(
            f"--all exports each configuration under its own name; --name names one export. "
            f"Received: name={args.name!r}"
        )
    if args.name is not None:
        check_serving_name(args.name, "name")  # as this command calls it, not as export_model does (serving_name)
    if args.allow_chance and args.source is None:
        raise ValueError(
            "--allow-chance exports a run or preset whose recorded accuracy is at chance; --model and "
            "--all export initial (untrained) weights, which their metadata says. Received: "
            "allow_chance=True"
        )
    options = {
        "format": args.format,
        "version": args.version,
        "serving_name": args.name,
        "serve": args.serve,
        "jit_compile": args.jit_compile,
        "compute_dtype": args.compute_dtype,
    }
    export_dir = _export_root(args.export_dir)
    if args.source is not None:
        paths = [export_source(args.source, export_dir, allow_chance=args.allow_chance, **options)]
    else:
        if args.model is not None:
            _check_models([args.model], "model")  # named as given: --model, not the export's --name
        names = paper_configurations() if args.all else [args.model]
        paths = [export_registered(name, export_dir, **options) for name in names]
    for path in paths:
        print(path)
    return 0


def _export_root(export_dir):
    """`--export-dir` of export and serve: a folder, or absent for the format's default; never "none".

    In `attnconv train`, `--export-dir none` means no export; these commands have no such choice, and the
    same word must not mean the default folder here.
    """
    from keras_attnconv.utils.checks import none_word

    if export_dir is not None and none_word(export_dir) is None:
        raise ValueError(
            f"`export_dir` names the export root; leave it out for the format's default "
            f"(`--export-dir none` means no export in `attnconv train`). Received: "
            f"export_dir={export_dir!r}"
        )
    return export_dir


def _serve(args):
    from keras_attnconv.export.exporter import set_served_version

    path = set_served_version(_export_root(args.export_dir), args.name, args.version)
    print(f"{path}: {args.name} serves version {args.version}")
    return 0


def _plot(args):
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    from keras_attnconv.training.figures import check_figures_directory, run_figures, write_figures
    from keras_attnconv.training.run_directory import RunDirectory
    from keras_attnconv.utils.files import check_writable

    if not 0 < args.dpi < 10_000:  # NaN too
        raise ValueError(f"`dpi` must be a positive number of dots per inch. Received: dpi={args.dpi}")
    run = RunDirectory(args.source)
    default = run.figures_dir if run.is_ours() else Path("figures")
    out = Path(args.output) if args.output is not None else default
    check_writable(out, "output")  # before the figures are drawn
    check_figures_directory(out)
    drawn = run_figures(args.source)
    for path in write_figures(drawn.figures, out, dpi=args.dpi):
        print(path)
    for name, why in drawn.absent.items():
        print(f"not drawn: {name}: {why}")
    return 0


def _convert(args):
    from keras_attnconv.analysis.conversion import measure_conversion

    measured = measure_conversion(
        args.filters,
        args.kernel_size,
        strides=args.strides,
        padding=args.padding,
        dilation=args.dilation,
        size=args.size,
        channels=args.channels,
        seed=args.seed,
    )
    print(
        f"Conv2D({args.filters}, {args.kernel_size}x{args.kernel_size}, strides={args.strides}, "
        f"padding={args.padding!r}, dilation={args.dilation}) on {args.size}x{args.size}x{args.channels} -> "
        f"attention with {measured.num_heads} quadratic heads (alpha=100)"
    )
    print(
        f"output {measured.output_shape}: max abs error {measured.max_abs_error:.3g}, "
        f"relative {measured.relative_error:.3g}"
    )
    return 0


def _chart_base(output):
    """Where the chart of a report written to `output` goes: beside its JSON, ``X.png`` and ``X.svg``."""
    from keras_attnconv.utils.reports import report_paths

    return os.path.splitext(report_paths(output)[0])[0]


def _write_chart(name, results, base):
    """Draws `results` with ``analysis.charts.<name>`` and writes it as `base` (PNG and SVG); returns whether it did.

    The measurements are the command's result, the chart a view of them: a
    machine without matplotlib (a bare accelerator image) keeps its results and says why there is no chart.
    """
    try:
        import matplotlib
    except ImportError as error:
        print(f"no chart: {error}", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from keras_attnconv.analysis import charts
    from keras_attnconv.utils.files import write_figure

    figure = getattr(charts, name)(results)
    write_figure(figure, base)
    plt.close(figure)
    return True


# The suites whose cases the command line chooses: which of --models, --precisions, --image-size and
# --bfloat16-serving each takes.
_SUITE_OVERRIDES = {
    "gpu": ("models", "precisions", "image_size"),
    "steps": ("models", "precisions"),
    "clusters": ("models", "precisions"),
    "formats": ("models", "bfloat16_serving"),
    "profile": ("models", "precisions"),
    "plan": ("models", "precisions", "target"),
}
# --bfloat16-serving's words, as `formats.measures_bfloat16_serving` takes them.
_BFLOAT16_SERVING = {"auto": "auto", "yes": True, "no": False}


def _names(text):
    """A comma-separated command-line list (``--models``, ``--precisions``) as a tuple of its stripped names."""
    return tuple(name.strip() for name in text.split(","))


def _suites_taking(key):
    """ "the gpu suite", "the gpu, steps and formats suites": those of `_SUITE_OVERRIDES` that take `key`."""
    takers = [suite for suite, keys in _SUITE_OVERRIDES.items() if key in keys]
    if len(takers) == 1:
        return f"the {takers[0]} suite"
    return f"the {', '.join(takers[:-1])} and {takers[-1]} suites"


def _bench(args):
    from keras_attnconv import bench
    from keras_attnconv.utils.files import check_writable, figure_paths
    from keras_attnconv.utils.reports import report_paths

    defaults = {
        "cpu": "bench.json",
        "gpu": "bench-gpu.json",
        "numerics": "numerics.json",
        "formats": "bench-formats.json",
        "steps": "bench-steps.json",
        "scale": "bench-scale.json",
        "profile": "bench-profile.json",
        "plan": "bench-plan.json",
        "clusters": "bench-clusters.json",
    }
    output = defaults[args.suite] if args.output is None else args.output  # '' is an error, not the default
    given = (
        ("models", args.models),
        ("precisions", args.precisions),
        ("image_size", args.image_size),
        ("bfloat16_serving", _BFLOAT16_SERVING.get(args.bfloat16_serving)),
        ("target", args.target),
    )
    overrides = {key: value for key, value in given if value is not None}
    refused = [key for key in overrides if key not in _SUITE_OVERRIDES.get(args.suite, ())]
    if refused:
        uses = ", ".join(f"--{key.replace('_', '-')} is for {_suites_taking(key)}" for key in refused)
        raise ValueError(f"{uses}; the {args.suite} suite has its own cases. Received: --suite {args.suite}")
    _check_models(overrides.get("models", ()), "models")
    chart = _chart_base(output) if args.suite in ("cpu", "gpu") else None  # the suites with speed-ups to draw
    for path in [*report_paths(output), *(figure_paths(chart) if chart else [])]:  # before the benchmark
        check_writable(path, "output", file=True)
    drawn = False
    if args.suite == "numerics":  # it trains: the application's, not the benchmarks'
        from keras_attnconv.training import numerics

        results = numerics.run_numerics(quick=args.quick, output=output, command=args.command_line)
        print(numerics.numerics_markdown(results))
        if not results["ok"]:
            raise RuntimeError(f"a numerics check failed: see {report_paths(output)[0]}")
    elif args.suite == "gpu":
        results = bench.run_gpu_benchmark(quick=args.quick, output=output, command=args.command_line, **overrides)
        print(bench.gpu_markdown(results))
        drawn = _write_chart("plot_gpu_steps", results, chart)
    elif args.suite == "scale":
        results = bench.run_scale_benchmark(quick=args.quick, output=output, command=args.command_line)
        print(bench.scale_markdown(results))
    elif args.suite == "formats":
        results = bench.run_format_benchmark(quick=args.quick, output=output, **overrides)
        print(bench.formats_markdown(results["formats"], results["settings"]["repeats"]))
    elif args.suite == "profile":
        print(bench.profile_markdown(bench.run_profile(quick=args.quick, output=output, **overrides)))
    elif args.suite == "plan":
        results = bench.run_plan(quick=args.quick, output=output, command=args.command_line, **overrides)
        print(bench.plan_markdown(results))
    elif args.suite == "steps":
        print(bench.step_markdown(bench.run_step_benchmark(quick=args.quick, output=output, **overrides)))
    elif args.suite == "clusters":
        print(bench.clusters_markdown(bench.run_clusters_benchmark(quick=args.quick, output=output, **overrides)))
    else:
        results = bench.run_benchmark(quick=args.quick, output=output)
        print(bench.markdown_tables(results))
        drawn = _write_chart("plot_speedups", results, chart)
    print("\nwrote {} and {}".format(*report_paths(output)))
    if chart and drawn:
        print("drew {} and {}".format(*figure_paths(chart)))
    return 0


def _compare(args):
    from keras_attnconv.training.comparison import ENCODINGS, compare_models, markdown_table
    from keras_attnconv.utils.files import check_writable, figure_paths
    from keras_attnconv.utils.reports import report_paths

    overrides = {"verbose": 0, "runs_dir": args.runs_dir}
    if args.epochs is not None:  # --epochs 0 is a value to check, not an absent one
        overrides["epochs"] = args.epochs
    models = args.models.split(",") if args.models is not None else ENCODINGS
    chart = _chart_base(args.output)
    for path in figure_paths(chart):  # before any training; compare_models checks its own files
        check_writable(path, "output", file=True)
    results = compare_models(args.recipe, models=models, output=args.output, **overrides)
    print(markdown_table(results))
    drawn = _write_chart("plot_comparison", results, chart)
    print("wrote {} and {}".format(*report_paths(args.output)))
    if drawn:
        print("drew {} and {}".format(*figure_paths(chart)))
    return 0


def _report_of_runs(args, report_of, markdown_of, **arguments):
    """`attnconv table1` and `attnconv choices`: a results file of the runs, updating the earlier one if asked."""
    import json
    from pathlib import Path

    from keras_attnconv.utils.files import check_writable
    from keras_attnconv.utils.reports import report_paths, write_report

    for path in report_paths(args.output):
        check_writable(path, "output", file=True)
    earlier = json.loads(Path(report_paths(args.output)[0]).read_text()) if args.update else None
    report = report_of(
        args.runs,
        data_name=args.data_name,
        data_file=args.data_file,
        command=args.command_line,
        earlier=earlier,
        **arguments,
    )
    markdown = markdown_of(report)
    write_report(args.output, report, markdown)
    print(markdown)
    return 0


def _table1(args):
    from keras_attnconv.training.table1 import table1_markdown, table1_report

    return _report_of_runs(
        args,
        table1_report,
        table1_markdown,
        commit=args.commit,
        libraries=args.libraries,
        device=args.device,
        side_by_side=args.side_by_side,
    )


def _choices(args):
    from keras_attnconv.training.choice_gains import choice_gains_markdown, choice_gains_report

    return _report_of_runs(args, choice_gains_report, choice_gains_markdown, base=args.base)


def _help_hint(where):
    """The end of every command-line error: where the arguments are listed."""
    return f"`{where} --help` lists the arguments."


class _Parser(argparse.ArgumentParser):
    """argparse with this package's errors: one line, and the closest choice to a mistyped one."""

    def _check_value(self, action, value):
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as error:  # a value not among the choices: `--format onxx`, `attnconv trian`
            from keras_attnconv.utils.checks import did_you_mean

            raise argparse.ArgumentError(action, f"{error.message}.{did_you_mean(value, action.choices)}") from None

    def error(self, message):
        # argparse prints its usage first; the package's other errors are one line, and so is this one.
        end = "" if message.endswith((".", "?")) else "."  # argparse's own messages end with no full stop
        self.exit(2, f"{self.prog}: error: {message}{end} {_help_hint(self.prog)}\n")


def build_parser():
    # No abbreviations: --epoch must not be taken for --epochs, nor a later option's prefix for an earlier one.
    parser = _Parser(
        prog="attnconv",
        allow_abbrev=False,
        description="keras_attnconv: self-attention as convolution (Cordonnier et al., ICLR 2020).",
    )
    from keras_attnconv.version import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and TensorFlow's logs")
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # --debug also after the command name
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name, **kwargs):
        return commands.add_parser(name, parents=[common], allow_abbrev=False, **kwargs)

    listing = add("list", help="the model zoo: parameters and FLOPs beside the paper's")
    listing.add_argument(
        "models", nargs="*", help="only these models: names or glob patterns, e.g. 'quadratic*' (default: all)"
    )
    listing.add_argument(
        "--recount",
        action="store_true",
        help="build each model and count it, instead of the counts recorded in the package",
    )
    listing.set_defaults(handler=_list)

    import dataclasses

    from keras_attnconv.training.recipe import FIELD_MEANINGS, TrainConfig

    recipes = add("recipes", help="the package's recipes (the paper's configurations) with their paper rows")
    recipes.set_defaults(handler=_recipes)

    training = add(
        "train",
        help="train a model from a recipe (attnconv recipes lists them); resumes an interrupted run",
        description="Train a configuration. Every recipe field can be overridden: --epochs 3, "
        "--precision mixed_bfloat16, --model-overrides '{num_layers = 2}'. Values are TOML literals.",
    )
    training.add_argument(
        "--recipe", help="a recipe's name (attnconv recipes) or a TOML file (default: Table 2 values)"
    )
    for field in dataclasses.fields(TrainConfig):
        training.add_argument(
            f"--{field.name.replace('_', '-')}",
            dest=field.name,
            metavar="VALUE",
            help=f"{FIELD_MEANINGS[field.name]} (recipe field {field.name}, default {_describe_default(field)})",
        )
    # Not recipe fields: they differ from process to process of one run (Keras' KERAS_DISTRIBUTION_* variables
    # give them too).
    training.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="data_parallel on several processes (JAX): process 0's address, which every process gives",
    )
    training.add_argument("--num-processes", metavar="N", help="data_parallel: the number of processes")
    training.add_argument("--process-id", metavar="I", help="data_parallel: this process' id, 0 to N-1 (0 writes)")
    training.set_defaults(handler=_train)

    exporting = add(
        "export",
        help="export a run's or a preset's model (or registered ones) as SavedModel, ONNX or "
        "LiteRT, under its own name: <export-dir>/<name>/<version>/",
    )
    exporting.add_argument("source", nargs="?", help="a training run directory (its preset/) or a preset directory")
    exporting.add_argument("--model", help="a registered model name, exported with initial (untrained) weights")
    exporting.add_argument(
        "--all",
        action="store_true",
        help="every registered full-size configuration, initial weights, each under its own name",
    )
    exporting.add_argument(
        "--format",
        choices=("saved_model", "onnx", "litert"),
        default="saved_model",
        help="saved_model (TF Serving, default), onnx (onnxruntime) or litert (LiteRT interpreter)",
    )
    exporting.add_argument("--name", help="serve under this name instead of the model's own (letters, digits, _ - .)")
    exporting.add_argument("--version", type=int, help="version number (default: the next free one)")
    exporting.add_argument("--export-dir", help="export root (default: saved_models, onnx_models or litert_models)")
    exporting.add_argument(
        "--serve", action="store_true", help="make models.config serve this version (default: the served version stays)"
    )
    exporting.add_argument(
        "--allow-chance",
        action="store_true",
        help="export a run or preset whose recorded validation accuracy is at chance (1/classes "
        "within 2 standard errors: it learned nothing), which is refused otherwise; "
        "metadata.json records it",
    )
    exporting.add_argument("--jit-compile", action="store_true", help="export an XLA-compiled serving function")
    exporting.add_argument(
        "--compute-dtype",
        default="float32",
        help="float32 (default), or bfloat16 for a SavedModel whose matmuls run in bfloat16 behind "
        "the same float32 signature: faster only on a CPU with bfloat16 units "
        "(docs/export.md)",
    )
    exporting.set_defaults(handler=_export)

    serving = add("serve", help="choose the version of a SavedModel that models.config serves (TF Serving)")
    serving.add_argument("name", help="the model's directory name under the export root")
    serving.add_argument("version", type=int, help="an exported version of it")
    serving.add_argument("--export-dir", help="export root (default: saved_models)")
    serving.set_defaults(handler=_serve)

    plotting = add(
        "plot", help="draw a training run's or a preset's figures (attention, training curves) as PNG and SVG"
    )
    plotting.add_argument("source", help="a training run directory or a preset directory")
    plotting.add_argument(
        "--output", help="directory of the figures (default: SOURCE/figures for a run, ./figures for a preset)"
    )
    plotting.add_argument("--dpi", type=float, default=100, help="resolution of the PNG files (default 100)")
    plotting.set_defaults(handler=_plot)

    converting = add(
        "convert",
        help="turn a random Conv2D into attention (Theorem 1), print the error",
        description="Builds a Conv2D with random weights, the attention layer that computes it (Theorem 1: one "
        "quadratic head per kernel tap), runs both on random images and prints the largest and the relative error.",
    )
    for flag, default, meaning in (
        ("--kernel-size", 3, "the kernel's height and width"),
        ("--filters", 8, "the convolution's output channels"),
        ("--channels", 4, "the images' input channels"),
        ("--size", 16, "the images' height and width"),
        ("--strides", 1, "the convolution's strides"),
        ("--dilation", 1, "the kernel's dilation"),
    ):
        converting.add_argument(flag, type=int, default=default, help=f"{meaning} (default %(default)s)")
    converting.add_argument(
        "--padding", choices=("same", "valid"), default="same", help="the convolution's padding (default %(default)s)"
    )
    converting.add_argument(
        "--seed", type=int, default=0, help="seed of the weights and the images (default %(default)s)"
    )
    converting.set_defaults(handler=_convert)

    benchmarking = add("bench", help="benchmark the attention paths and the models' training steps")
    benchmarking.add_argument(
        "--suite",
        default="cpu",
        choices=("cpu", "gpu", "numerics", "formats", "steps", "clusters", "scale", "profile", "plan"),
        help="cpu: attention paths, steps vs ResNet-18, memory and export formats (default); "
        "gpu: the paper's models at batch 100 in float32/mixed_bfloat16/mixed_float16 on "
        "the accelerator; numerics: training, far centers and large grids in the three "
        "precisions; formats: inference in each export format's runtime beside Keras; steps: "
        "each model's training step on each path (XLA, TensorFlow's graph), the part of cpu "
        "that the jit_compile=auto rule stands on, each graph step as attnconv train runs it (with the "
        "element-wise XLA clusters it sets, in a worker process of their own); clusters: each model's "
        "graph step without and with "
        "element-wise XLA clusters (TF_XLA_FLAGS), what attnconv train sets on CPUs with bfloat16 units; "
        "scale: training images/s with data "
        "parallelism over 1, 2, 4, ... devices (JAX; simulated CPU devices where there is no "
        "accelerator); profile: where a model's step time goes (the quadratic one's, or "
        "the one --models names), by op kind, from the backend's profiler, on each path "
        "(the graph step as attnconv train runs it) in float32 and mixed_bfloat16 (on a GPU "
        "with JAX: its kernels, batch 100); plan: "
        "each model's training step compiled for an H200 or H100 (--target) without one "
        '(needs pip install "jax[cuda12]"), its kernels\' bytes, FLOPs and floor',
    )
    benchmarking.add_argument("--quick", action="store_true", help="tiny shapes, a smoke test (about a minute)")
    benchmarking.add_argument(
        "--models",
        type=_names,
        default=None,
        help="gpu, steps, clusters, formats and plan suites: the models to measure, comma-separated "
        "(default: the suite's paper models; tiny ones with --quick); profile suite: the one "
        "model to profile (default: quadratic; quadratic_tiny with --quick)",
    )
    benchmarking.add_argument(
        "--precisions",
        type=_names,
        default=None,
        help="gpu, steps, clusters, profile and plan suites: the training precisions to measure, "
        "comma-separated (default: float32, mixed_bfloat16 and, on the "
        "gpu suite, mixed_float16; a GPU run cut short by a time limit "
        "can measure the rest into a file of its own)",
    )
    benchmarking.add_argument(
        "--target",
        choices=("h200", "h100"),
        default=None,
        help="plan suite: the GPU to compile for (default: h200)",
    )
    benchmarking.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="gpu suite: the images' height and width (default: the suite's, 32; 8 with --quick)",
    )
    benchmarking.add_argument(
        "--bfloat16-serving",
        choices=tuple(_BFLOAT16_SERVING),
        default=None,
        help="formats suite: whether to measure the SavedModel computing in bfloat16 (default: "
        "auto, where the CPU has bfloat16 units, AMX or AVX-512 BF16; yes with --quick)",
    )
    benchmarking.add_argument(
        "--output",
        default=None,
        help="JSON output, a .md table written beside, and for the cpu and gpu suites a chart "
        "(.png, .svg) (default: bench.json, bench-gpu.json, numerics.json, "
        "bench-formats.json, bench-steps.json, bench-scale.json)",
    )
    benchmarking.set_defaults(handler=_bench)

    tabulating = add("table1", help="the paper's Table 1 beside trained runs: a results file (JSON and markdown)")
    _add_results_of_runs_arguments(
        tabulating,
        runs="training run directories (a stopped run gives its first epochs)",
        output="table1.json",
        update="keep the runs of the output's earlier results unless these runs replace their "
        "recipes (the runs of several sessions in one table)",
    )
    tabulating.add_argument(
        "--commit", help="the package's commit the runs trained with, for runs that did not record it"
    )
    tabulating.add_argument("--libraries", help='the versions, for runs that did not record them: "jax 0.11.2"')
    tabulating.add_argument("--device", help="the device, for runs that did not record it")
    tabulating.add_argument(
        "--side-by-side",
        action="store_true",
        help="the runs trained at the same time on one device: the tables say so beside their minutes",
    )
    tabulating.set_defaults(handler=_table1)

    gaining = add("choices", help="training choices' gains: runs that changed settings of a base run, beside it")
    _add_results_of_runs_arguments(
        gaining,
        runs="finished training run directories, each with settings changed",
        output="choices.json",
        update="keep the runs of the output's earlier results unless these runs make the same changes",
    )
    gaining.add_argument(
        "--base",
        required=True,
        help="the base run: a run directory, or a Table 1 results file (its finished run of the runs' model)",
    )
    gaining.set_defaults(handler=_choices)

    comparing = add("compare", help="train several models with one recipe and tabulate accuracy")
    comparing.add_argument("--recipe", default="quick", help="a recipe's name or a TOML file (default: quick)")
    comparing.add_argument("--models", help="comma-separated model names (default: one small model per encoding)")
    comparing.add_argument("--epochs", type=int, help="override the recipe's epochs")
    comparing.add_argument("--runs-dir", default="runs", help="where the runs go (runs/compare-<model>)")
    comparing.add_argument(
        "--output",
        default="compare.json",
        help="JSON output (a .md table and a chart, .png and .svg, are written beside)",
    )
    comparing.set_defaults(handler=_compare)
    return parser


def _add_results_of_runs_arguments(command, runs, output, update):
    """The arguments `_report_of_runs` reads, with each command's own help."""
    command.add_argument("runs", nargs="+", help=runs)
    command.add_argument("--data-name", required=True, help='what the data is, e.g. "CIFAR-10 (JPEG copy)"')
    command.add_argument("--data-file", required=True, help="the file the data came from (its digest is recorded)")
    command.add_argument("--output", default=output, help="JSON output (a .md table is written beside)")
    command.add_argument("--update", action="store_true", help=update)


def _quiet_start_up(debug):
    """Silences TensorFlow's and absl's start-up logs (CUDA probing on a CPU machine, CPU features, ...).

    Errors still reach the user as exceptions (one line, see `main`); with
    ``--debug`` every log is shown. A value the user set in the environment wins.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if debug else "3")
    if not debug:
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def _one_line(error, limit=600):
    message = " ".join(str(error).split()) or type(error).__name__
    if len(message) > limit:  # e.g. a backend error that prints a whole tensor: keep what was received
        received = message.rfind("Received:")
        tail = message[received : received + limit // 2] if received >= 0 else ""
        head = message[: limit - len(tail)]
        # Shorten at a word's end, never inside a name (a list of models loses its last names, not half of one).
        cut = head.rfind(" ")
        message = (head[:cut] if cut > 0 else head).rstrip(",;") + " ... " + tail
    if isinstance(error, (KeyError, ModuleNotFoundError)) or not str(error):
        message = f"{type(error).__name__}: {message}"
    return message


def _refuse_unknown_arguments(parser, args, unknown):
    """One line naming the first argument the command does not take, with the closest flags of that command."""
    from keras_attnconv.utils.checks import did_you_mean

    command = getattr(args, "command", None)
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    flags = [
        flag
        for action in (commands.choices[command] if command else parser)._actions
        for flag in action.option_strings
        if flag.startswith("--")
    ]
    where = f"attnconv {command}" if command else "attnconv"
    first = unknown[0].split("=")[0]
    print(
        f"{where}: error: unknown argument {first!r}.{did_you_mean(first, flags)} {_help_hint(where)} "
        f"Received: {' '.join(unknown)}",
        file=sys.stderr,
    )
    return 2


def main(argv=None):
    """Runs one `attnconv` command; returns its exit code (0, or 2 for any error: one line on stderr).

    ``--debug`` shows the error's traceback and TensorFlow's logs instead.
    """
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        return _refuse_unknown_arguments(parser, args, unknown)
    args.command_line = shlex.join(["attnconv", *argv])  # recorded in results files, quoted as a shell takes it
    _quiet_start_up(args.debug)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    from keras_attnconv.utils.console import native_log_filter

    try:
        with contextlib.nullcontext() if args.debug else native_log_filter():
            code = args.handler(args)
            sys.stdout.flush()  # here, where a reader that stopped reading is handled, not at exit
            return code
    except KeyboardInterrupt:
        print(f"attnconv {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `attnconv list | head -3`: the reader has what it wanted; nothing went wrong here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 141  # as a process that SIGPIPE ended
    except Exception as error:  # every error: one line and exit 2 (a traceback with --debug)
        if args.debug:
            raise
        print(f"attnconv {args.command}: error: {_one_line(error)} (--debug shows the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
