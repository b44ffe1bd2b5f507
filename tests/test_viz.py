"""The attention figures: panels per layer/head, centers drawn where the layers put them, files written."""

import keras
import matplotlib
import numpy as np
import pytest
from keras import ops

matplotlib.use("Agg")

from keras_attnconv import build_model, save_to_preset
from keras_attnconv.analysis import viz
from keras_attnconv.training.figures import run_figures

SMALL = {"num_layers": 2, "hidden_dim": 8, "intermediate_dim": 8, "image_size": 12}


@pytest.mark.parametrize("name", ["quadratic_tiny", "gaussian_tiny"])
def test_centers_figure_draws_each_layers_centers(name):
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
    figure = viz.plot_attention_maps(model, np.zeros((12, 12, 3), np.uint8), query=(3, 2))
    images = [a for a in figure.axes if a.get_visible() and a.images]
    assert len(images) == 2 * 9
    probabilities = images[0].images[0].get_array()
    assert probabilities.shape == (6, 6) and np.isclose(probabilities.sum(), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match=r"query=\(6, 0\)"):
        viz.plot_attention_maps(model, np.zeros((12, 12, 3), np.uint8), query=(6, 0))
    with pytest.raises(ValueError, match="uint8 image.*Received: image float64"):
        viz.plot_attention_maps(model, np.zeros((12, 12, 3)), query=(3, 2))


def test_models_without_centers_are_rejected():
    with pytest.raises(ValueError, match="quadratic and gaussian encodings only"):
        viz.plot_attention_centers(build_model("learned_tiny", **SMALL))


def _run_directory(path, model, dataset, history=None):
    """A training run directory as `train` leaves it: its best model as a preset, the center history."""
    save_to_preset(model, path / "preset", metadata={"dataset": dataset})
    if history is not None:
        np.savez(path / "centers_history.npz", **history)
    return path


def test_run_figures_draw_the_checkpoints_centers_and_the_recorded_history(tmp_path):
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    history = {"encoder_0": np.zeros((3, 9, 2)), "encoder_1": np.ones((3, 9, 2))}
    run = _run_directory(tmp_path / "run", model, "cifar10", history)
    figures = run_figures(run)
    assert sorted(figures) == ["attention_centers", "centers_history"]  # cifar10 maps would need a download
    drawn = np.array([line.get_xydata()[0] for line in figures["attention_centers"].axes[1].lines])
    centers = ops.convert_to_numpy(model.get_layer("encoder_1").attention.position_score.centers)
    np.testing.assert_allclose(drawn[:, ::-1], centers, atol=1e-6)
    trajectory = figures["centers_history"].axes[1].lines[0].get_xydata()
    np.testing.assert_array_equal(trajectory, np.ones((3, 2)))


def test_run_figures_map_the_central_query_of_the_first_evaluation_image(tmp_path):
    from keras_attnconv.analysis.attention import attention_probabilities
    from keras_attnconv.training.data import dataset_info, load_arrays

    model = build_model("learned_tiny", seed=0, **{**SMALL, "image_size": 32})
    figures = run_figures(_run_directory(tmp_path / "run", model, "cifar10_sample"))
    assert sorted(figures) == ["attention_maps"]  # learned heads have no centers, no history was recorded
    image = load_arrays("cifar10_sample", dataset_info("cifar10_sample").eval_split)[0][0]
    expected = attention_probabilities(model, image)[0][0, 8 * 16 + 8].reshape(16, 16)  # query (8, 8) of 16x16
    np.testing.assert_allclose(figures["attention_maps"].axes[0].images[0].get_array(), expected, atol=1e-6)


def test_run_figures_need_a_run_or_a_preset(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"neither a finished training run.*source='{tmp_path}'"):
        run_figures(tmp_path)


def test_a_preset_is_plotted_like_its_run(tmp_path):
    model = build_model("quadratic_tiny", seed=0, **{**SMALL, "image_size": 32})
    run = _run_directory(tmp_path / "run", model, "cifar10_sample")
    from_run, from_preset = run_figures(run), run_figures(run / "preset")
    assert sorted(from_run) == sorted(from_preset) == ["attention_centers", "attention_maps"]
    np.testing.assert_array_equal(from_run["attention_maps"].axes[0].images[0].get_array(),
                                  from_preset["attention_maps"].axes[0].images[0].get_array())


def test_a_windowed_models_maps_place_each_windows_keys_on_the_image_grid():
    from keras_attnconv.analysis.attention import attention_probabilities
    from keras_attnconv.layers.encoder import encoder_blocks

    model = build_model("absolute_learned_local_tiny", seed=0, **{**SMALL, "image_size": 24})  # 12x12 grid, 7x7 window
    image = np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    maps = attention_probabilities(model, image)
    assert [m.shape for m in maps] == [(9, 144, 144)] * 2
    block = encoder_blocks(model)[0]
    x = keras.Model(model.inputs, block.input)(image[None])
    window, key_indices = (ops.convert_to_numpy(s) for s in block.attention(x, return_attention_scores=True)[1])
    query = 5 * 12 + 6
    np.testing.assert_allclose(maps[0][:, query, key_indices[query]], window[0, :, query], atol=1e-7)
    outside = np.setdiff1d(np.arange(144), key_indices[query])
    assert (maps[0][:, query, outside] == 0).all() and np.allclose(maps[0].sum(-1), 1, atol=1e-5)
    figure = viz.plot_attention_maps(model, image, query=(5, 6))
    drawn = figure.axes[0].images[0].get_array()
    assert drawn.shape == (12, 12) and np.count_nonzero(drawn) == 49  # the 7x7 window around the query


def test_run_figures_of_a_model_with_nothing_to_draw_say_so(tmp_path):
    model = build_model("resnet_tiny", seed=0)
    with pytest.raises(ValueError, match=f"Nothing to draw for {tmp_path / 'run'}: .*it has no attention heads"):
        run_figures(_run_directory(tmp_path / "run", model, "cifar10_sample"))
