"""The charts of `attnconv compare` and `attnconv bench`: one bar or point per measured row, error bars of the
accuracy's standard error, labelled axes, series told apart without colour."""

import math

import matplotlib
import matplotlib.pyplot
import numpy as np
import pytest

matplotlib.use("Agg")

from keras_attnconv.analysis import charts

COMPARISON = {
    "recipe": "quick",
    "dataset": "cifar10_sample",
    "epochs": 8,
    "eval_split": "validation",
    "machine": {"cpus": 2, "backend": "tensorflow"},
    "rows": [
        {"model": "quadratic_tiny", "eval_accuracy": 0.3, "eval_examples": 500, "train_images_per_second": 70.0},
        {"model": "learned_tiny", "eval_accuracy": 0.4, "eval_examples": 500, "train_images_per_second": 90.0},
        {"model": "siren_tiny", "eval_accuracy": 0.2, "train_images_per_second": None},
    ],  # an older run's row
}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")


def test_the_standard_error_of_an_accuracy_is_the_binomials():
    assert charts.accuracy_standard_error(0.3, 500) == pytest.approx(math.sqrt(0.3 * 0.7 / 500))
    assert math.isnan(charts.accuracy_standard_error(0.3, None))


def test_the_comparison_chart_has_one_bar_per_model_most_accurate_on_top_with_its_standard_error():
    figure = charts.plot_comparison(COMPARISON)
    accuracy, speed = figure.axes
    assert [label.get_text() for label in accuracy.get_yticklabels()] == [
        "siren_tiny",
        "quadratic_tiny",
        "learned_tiny",
    ]
    np.testing.assert_allclose([bar.get_width() for bar in accuracy.patches], [20, 30, 40])
    from matplotlib.container import ErrorbarContainer

    (bars,) = [c for c in accuracy.containers if isinstance(c, ErrorbarContainer)]
    error_bars = bars.lines[2][0].get_segments()  # (data line, caps, bar segments)
    half_widths = [(segment[1][0] - segment[0][0]) / 2 for segment in error_bars]
    np.testing.assert_allclose(half_widths, [0, 100 * math.sqrt(0.21 / 500), 100 * math.sqrt(0.24 / 500)])
    assert "standard error" in accuracy.get_xlabel() and speed.get_xlabel() == "training images per second"
    assert [bar.get_width() for bar in speed.patches] == [0.0, 70.0, 90.0]
    assert accuracy.patches[0].get_hatch() != speed.patches[0].get_hatch()  # not told apart by colour alone
    with pytest.raises(ValueError, match="`results` must be a results dict with at least one row"):
        charts.plot_comparison({"rows": []})


def test_the_cpu_benchmark_chart_draws_each_comparisons_speed_up_per_token_count_and_each_model_against_resnet():
    results = {
        "machine": {"processor": "x86_64", "cpus": 2},
        "settings": {"comparisons": ["separable", "window7"]},
        "layer": [
            {"comparison": name, "tokens": tokens, "fast_mode": name, "speedup": speedup}
            for name, base in (("separable", 1.5), ("window7", 2.0))
            for tokens, speedup in (("16x16", 2 * base), ("8x8", base))
        ],
        "models": [
            {"model": "resnet_tiny", "precision": "float32", "step_ms": 10.0},
            {"model": "quadratic_tiny", "precision": "float32", "step_ms": 25.0},
        ],
    }
    figure = charts.plot_speedups(results)
    layer, models = figure.axes
    lines = [line for line in layer.lines if line.get_label().startswith(("separable", "window7"))]
    np.testing.assert_array_equal(lines[0].get_xydata(), [[64, 1.5], [256, 3.0]])
    assert lines[0].get_marker() != lines[1].get_marker()
    assert layer.get_xlabel().startswith("tokens") and "speed-up" in layer.get_ylabel()
    assert [bar.get_width() for bar in models.patches] == [2.5]  # 25 ms against ResNet's 10 ms


def test_the_cpu_benchmark_chart_sets_each_models_step_against_resnets_on_the_same_path():
    results = {
        "machine": {"processor": "x86_64", "cpus": 2, "cpu": {"model": "Some CPU"}},
        "settings": {"comparisons": []},
        "layer": [],
        "models": [
            {"model": model, "precision": "float32", "path": path, "step_ms": step}
            for model, path, step in (
                ("resnet_tiny", "xla", 10.0),
                ("quadratic_tiny", "xla", 25.0),
                ("resnet_tiny", "graph", 5.0),
                ("quadratic_tiny", "graph", 20.0),
            )
        ],
    }
    figure = charts.plot_speedups(results)
    models = figure.axes[1]
    assert [bar.get_width() for bar in models.patches] == [2.5, 4.0]
    assert [label.get_text() for label in models.get_yticklabels()] == [
        "quadratic_tiny (float32, xla)",
        "quadratic_tiny (float32, graph)",
    ]
    assert "Some CPU" in figure.get_suptitle()


def test_the_gpu_benchmark_chart_draws_every_model_in_every_precision_and_the_speed_up_over_float32():
    rows = [
        {"model": "quadratic", "path": None, "precision": precision, "step_ms": step}
        for precision, step in (("float32", 40.0), ("mixed_bfloat16", 20.0))
    ]
    figure = charts.plot_gpu_steps({"rows": rows, "device": {"device": "H100"}, "settings": {"batch": 100}})
    steps, speedups = figure.axes
    assert [bar.get_width() for bar in steps.patches] == [40.0, 20.0]
    assert [bar.get_width() for bar in speedups.patches] == [1.0, 2.0]
    assert [text.get_text() for text in steps.get_legend().get_texts()] == ["float32", "mixed_bfloat16"]


def test_the_gpu_benchmark_chart_draws_the_unscaled_float16_case_beside_the_scaled_one():
    # Same model, path and precision: only loss scaling tells the two apart, and neither may hide the other.
    rows = [
        {"model": "resnet18", "path": None, "precision": precision, "step_ms": step, "loss_scaling": scaling}
        for precision, step, scaling in (
            ("float32", 40.0, True),
            ("mixed_float16", 20.0, True),
            ("mixed_float16", 10.0, False),
        )
    ]
    figure = charts.plot_gpu_steps({"rows": rows, "device": {"device": "H100"}, "settings": {"batch": 100}})
    steps, speedups = figure.axes
    assert [bar.get_width() for bar in steps.patches] == [40.0, 20.0, 10.0]
    assert [bar.get_width() for bar in speedups.patches] == [1.0, 2.0, 4.0]
    assert [text.get_text() for text in steps.get_legend().get_texts()] == [
        "float32",
        "mixed_float16",
        "mixed_float16, no loss scaling",
    ]
