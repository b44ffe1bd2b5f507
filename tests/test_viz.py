"""The attention figures: panels per layer/head, centres drawn where the layers put them, files written."""

import json

import matplotlib
import numpy as np
import pytest
from keras import ops

matplotlib.use("Agg")

from keras_attnconv import build_model, viz  # noqa: E402

SMALL = {"num_layers": 2, "hidden_dim": 8, "intermediate_dim": 8, "image_size": 12}


@pytest.mark.parametrize("name", ["quadratic_tiny", "gaussian_tiny"])
def test_centres_figure_draws_each_layers_centres(name):
    model = build_model(name, seed=0, **SMALL)
    figure = viz.plot_attention_centers(model)
    axes = [a for a in figure.axes if a.get_visible()]
    assert len(axes) == 2
    for axis, block in zip(axes, ["encoder_0", "encoder_1"]):
        centers = ops.convert_to_numpy(model.get_layer(block).attention.position_score.centers)
        drawn = np.array([line.get_xydata()[0] for line in axis.lines])  # (column, row) per head
        np.testing.assert_allclose(drawn[:, ::-1], centers, atol=1e-6)
        assert len(axis.patches) == 2 * 9 + 1  # 50% and 90% contour per head, and the query pixel


def test_attention_maps_have_one_panel_per_head_and_layer():
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    figure = viz.plot_attention_maps(model, np.zeros((12, 12, 3)), query=(3, 2))
    images = [a for a in figure.axes if a.get_visible() and a.images]
    assert len(images) == 2 * 9
    probabilities = images[0].images[0].get_array()
    assert probabilities.shape == (6, 6) and np.isclose(probabilities.sum(), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match=r"query=\(6, 0\)"):
        viz.plot_attention_maps(model, np.zeros((12, 12, 3)), query=(6, 0))


def test_centres_history_records_each_epoch_and_plots(tmp_path):
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    history = viz.AttentionCentersHistory(tmp_path / "centers.npz")
    model.fit(np.random.default_rng(0).normal(size=(4, 12, 12, 3)), np.arange(4), epochs=3, verbose=0,
              callbacks=[history])
    assert [len(v) for v in history.history.values()] == [4, 4]  # initial + 3 epochs
    assert not np.allclose(history.history["encoder_0"][0], history.history["encoder_0"][-1])
    restored = viz.load_centers_history(tmp_path / "centers.npz")
    np.testing.assert_array_equal(restored["encoder_1"][-1], history.history["encoder_1"][-1])
    figure = viz.plot_centers_history(restored)
    assert len([a for a in figure.axes if a.get_visible()]) == 2


def test_models_without_centres_are_rejected():
    with pytest.raises(ValueError, match="quadratic and gaussian encodings only"):
        viz.plot_attention_centers(build_model("learned_tiny", **SMALL))


def test_plot_command_writes_the_figures(tmp_path):
    from keras_attnconv import cli
    from keras_attnconv.training import TrainConfig, train

    run = tmp_path / "run"
    train(TrainConfig(model="quadratic_tiny", model_overrides={"num_layers": 1, "hidden_dim": 8},
                      dataset="cifar10_sample", epochs=1, steps_per_epoch=2, run_dir=str(run), verbose=0,
                      jit_compile=False, export_dir=None))
    assert cli.main(["plot", "--run", str(run)]) == 0
    for name in ("attention_centers", "attention_maps", "centers_history"):
        assert (run / "figures" / f"{name}.png").stat().st_size > 1000
    assert json.loads((run / "config.json").read_text())["model"] == "quadratic_tiny"


def test_convert_command_prints_a_tiny_error(capsys):
    from keras_attnconv import cli

    assert cli.main(["convert", "--kernel-size", "3", "--size", "8"]) == 0
    out = capsys.readouterr().out
    assert "9 quadratic heads" in out
    relative = float(out.split("relative ")[1].split()[0])
    assert relative < 1e-4
