"""The figures: panels per layer/head/query, legends, axis labels and colour bars, centers drawn where the layers
put them, every family of the zoo plotted, and files written only where the package may write them."""

import keras
import matplotlib
import matplotlib.pyplot
import numpy as np
import pytest
from keras import ops
from support import snapshot

matplotlib.use("Agg")

from keras_attnconv import build_model, cli, list_models, save_to_preset
from keras_attnconv.analysis import viz
from keras_attnconv.analysis.attention import layer_centers
from keras_attnconv.analysis.curves import plot_training_curves
from keras_attnconv.training.figures import run_figures, write_figures
from keras_attnconv.training.run_directory import RunDirectory
from keras_attnconv.utils.ownership import MARKER, write_mark

SMALL = {"num_layers": 2, "hidden_dim": 8, "intermediate_dim": 8, "image_size": 12}
HISTORY_CSV = (
    "epoch,accuracy,learning_rate,loss,val_accuracy,val_loss\n0,0.2,0.1,2.2,0.25,2.1\n1,0.3,0.05,2.0,0.3,2.0\n"
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")


def _legend_texts(figure):
    return [text.get_text() for legend in figure.legends for text in legend.get_texts()]


def _head_panels(figure):
    return [axis for axis in figure.axes if axis.get_label().startswith("attention:")]


@pytest.mark.parametrize("name", ["quadratic_tiny", "gaussian_tiny"])
def test_centers_figure_draws_each_layers_centers_and_contours(name):
    model = build_model(name, seed=0, **SMALL)
    figure = viz.plot_attention_centers(model)
    axes = [a for a in figure.axes if a.get_visible()]
    assert len(axes) == 2
    for axis, block in zip(axes, ["encoder_0", "encoder_1"]):
        centers = ops.convert_to_numpy(model.get_layer(block).attention.position_score.centers)
        drawn = np.array([line.get_xydata()[0] for line in axis.lines])  # (column, row) per head
        np.testing.assert_allclose(drawn[:, ::-1], centers, atol=1e-6)
        assert len(axis.patches) == 2 * 9 + 1  # 50% and 90% contour per head, and the query pixel


@pytest.mark.parametrize("spread", [0.0, 1e-6])
def test_a_head_whose_width_trained_to_zero_gets_no_contour_and_the_panel_says_so(spread):
    # A trained quadratic model (H200, 60 epochs) had such a head: its contours, a dashed line millions of
    # pixels long, kept `attnconv plot` rendering for minutes; its variance was a 0/0 NaN besides.
    model = build_model("quadratic_tiny", seed=0, quadratic_width="spread", **SMALL)
    score = model.get_layer("encoder_0").attention.position_score
    spreads = ops.convert_to_numpy(score.spreads).copy()
    spreads[2] = spread
    score.spreads.assign(spreads)
    assert not np.isnan(score.covariances).any()
    figure = viz.plot_attention_centers(model)
    first, second = [a for a in figure.axes if a.get_visible()]
    assert len(first.patches) == 2 * 8 + 1 and len(second.patches) == 2 * 9 + 1
    assert "1 nearly uniform head: no contour" in first.get_title()
    assert len(first.lines) == 9  # its center is still drawn


@pytest.mark.parametrize(
    "draw",
    [viz.plot_attention_centers, lambda model: viz.plot_attention_maps(model, np.zeros((8, 8, 3), "uint8"), (0, 0))],
)
def test_a_model_without_attention_is_named_by_the_figures_of_attention(draw):
    resnet = build_model("resnet_tiny", image_size=8)
    with pytest.raises(
        ValueError,
        match=r"^`model` must have attention layers .*: ResNet 'resnet_tiny' has none\. "
        r"Received: model='resnet_tiny'$",
    ):
        draw(resnet)


def test_centers_figure_has_pixel_axes_and_a_legend_of_heads_contours_and_query():
    figure = viz.plot_attention_centers(build_model("quadratic_tiny", seed=0, **SMALL))
    for axis in figure.axes:
        assert (axis.get_xlabel(), axis.get_ylabel()) == ("column shift (pixels)", "row shift (pixels)")
        assert axis.get_title().startswith("layer ")
    assert _legend_texts(figure) == [f"head {h}" for h in range(1, 10)] + [
        "50% of the attention",
        "90% of the attention",
        "query pixel",
    ]
    assert "Figure 4" in figure.get_suptitle()


def test_heads_differ_by_marker_not_only_by_colour():
    figure = viz.plot_attention_centers(build_model("quadratic_tiny", seed=0, **SMALL))
    assert len({line.get_marker() for line in figure.axes[0].lines}) == 9  # a greyscale print tells them apart


def test_attention_maps_have_one_panel_per_head_layer_and_query():
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    figure = viz.plot_attention_maps(model, np.zeros((12, 12, 3), np.uint8), queries=[(3, 2), (1, 1)])
    panels = _head_panels(figure)
    assert len(panels) == 2 * 2 * 9  # queries x layers x heads
    assert [a.get_label() for a in figure.axes if a.get_label().startswith("image:")] == [
        "image: query (3, 2)",
        "image: query (1, 1)",
    ]
    probabilities = panels[0].images[0].get_array()
    assert probabilities.shape == (6, 6) and np.isclose(probabilities.sum(), 1.0, atol=1e-5)
    assert [a.get_title() for a in panels[:9]] == [f"head {h}" for h in range(1, 10)]


def test_attention_maps_share_one_colour_bar_of_probabilities():
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    figure = viz.plot_attention_maps(model, np.zeros((12, 12, 3), np.uint8), queries=(3, 2))
    images = [panel.images[0] for panel in _head_panels(figure)]
    colorbars = [image.colorbar for image in images if image.colorbar is not None]
    assert len(colorbars) == 1 and colorbars[0].ax.get_ylabel() == "attention probability"
    assert all(image.norm is images[0].norm for image in images)  # one scale: the bar reads every panel
    assert images[0].norm.vmax == max(image.get_array().max() for image in images)
    assert _legend_texts(figure) == ["query pixel"]


def test_attention_maps_reject_a_query_off_the_grid_and_a_float_image():
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    with pytest.raises(ValueError, match=r"6x6 attention grid. Received: queries=\(6, 0\)"):
        viz.plot_attention_maps(model, np.zeros((12, 12, 3), np.uint8), queries=(6, 0))
    with pytest.raises(ValueError, match=r"Received: queries='ab'"):
        viz.plot_attention_maps(model, np.zeros((12, 12, 3), np.uint8), queries="ab")
    with pytest.raises(ValueError, match="uint8 image.*Received: image float64"):
        viz.plot_attention_maps(model, np.zeros((12, 12, 3)), queries=(3, 2))


def test_models_without_centers_are_rejected():
    with pytest.raises(ValueError, match=r"heads with a center \(the quadratic and Gaussian encodings\)"):
        viz.plot_attention_centers(build_model("learned_tiny", **SMALL))


def test_centers_history_draws_each_heads_trajectory_with_its_start_and_end():
    history = {"encoder_0": np.cumsum(np.ones((4, 9, 2)), axis=0), "encoder_1": np.zeros((4, 9, 2))}
    figure = viz.plot_centers_history(history)
    axis = figure.axes[0]
    assert len(axis.lines) == 3 * 9 + 1  # per head: trajectory, start, end; then the query pixel
    trajectory, start, end = axis.lines[:3]
    np.testing.assert_array_equal(trajectory.get_xydata(), history["encoder_0"][:, 0, ::-1])
    assert start.get_fillstyle() == "none" and end.get_fillstyle() == "full"
    np.testing.assert_array_equal(end.get_xydata(), history["encoder_0"][-1:, 0, ::-1])
    assert axis.get_title() == f"layer 1 (encoder_0), 3 epochs\nlargest move {3 * np.sqrt(2):.2g} pixels"
    assert axis.get_xlabel() == "column shift (pixels)" and "Figure 3" in figure.get_suptitle()
    assert _legend_texts(figure)[-3:] == ["start", "end", "query pixel"]


def test_training_curves_draw_loss_accuracy_and_learning_rate_per_epoch():
    history = {
        "loss": [2.2, 2.0, 1.9],
        "val_loss": [2.1, 2.0, 1.95],
        "accuracy": [0.2, 0.3, 0.35],
        "val_accuracy": [0.25, 0.3, 0.33],
        "learning_rate": [0.1, 0.05, 0.01],
    }
    figure = plot_training_curves(history)
    assert [axis.get_title() for axis in figure.axes] == ["loss", "accuracy", "learning rate"]
    assert all(axis.get_xlabel() == "epoch" for axis in figure.axes)
    loss = figure.axes[0]
    assert [line.get_label() for line in loss.lines] == ["training", "validation"]
    assert loss.get_legend() is not None and loss.lines[0].get_marker() != loss.lines[1].get_marker()
    np.testing.assert_array_equal(figure.axes[2].lines[0].get_xydata(), [[1, 0.1], [2, 0.05], [3, 0.01]])
    assert [a.get_title() for a in plot_training_curves({"loss": [1.0]}).axes] == ["loss"]
    with pytest.raises(ValueError, match=r"Received: history columns \['epoch'\]"):
        plot_training_curves({"epoch": [0]})


def _run_directory(path, model, dataset, history=None):
    """A training run directory as `train` leaves it: its mark, its best model as a preset, its records."""
    RunDirectory(path).claim()
    save_to_preset(model, path / "preset", metadata={"dataset": dataset, "training_run": ".."})
    (path / "history.csv").write_text(HISTORY_CSV)
    if history is not None:
        np.savez(path / "centers_history.npz", **history)
    return path


def test_run_figures_draw_the_checkpoints_centers_and_the_recorded_history(tmp_path):
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    history = {"encoder_0": np.zeros((3, 9, 2)), "encoder_1": np.ones((3, 9, 2))}
    drawn = run_figures(_run_directory(tmp_path / "run", model, "cifar10", history))
    assert sorted(drawn.figures) == ["attention_centers", "centers_history", "training_curves"]
    assert "'cifar10' images are not on this machine" in drawn.absent["attention_maps"]  # it would need a download
    lines = drawn.figures["attention_centers"].axes[1].lines
    centers = ops.convert_to_numpy(model.get_layer("encoder_1").attention.position_score.centers)
    np.testing.assert_allclose(np.array([line.get_xydata()[0] for line in lines])[:, ::-1], centers, atol=1e-6)
    trajectory = drawn.figures["centers_history"].axes[1].lines[0].get_xydata()
    np.testing.assert_array_equal(trajectory, np.ones((3, 2)))


def test_run_figures_map_two_queries_of_the_first_validation_images(tmp_path):
    from keras_attnconv.analysis.attention import attention_probabilities
    from keras_attnconv.training.data import dataset_info, load_arrays

    model = build_model("learned_tiny", seed=0, **{**SMALL, "image_size": 32})
    drawn = run_figures(_run_directory(tmp_path / "run", model, "cifar10_sample"))
    assert sorted(drawn.figures) == ["attention_maps_0", "attention_maps_1", "training_curves"]
    assert set(drawn.absent) == {"attention_centers", "centers_history"}  # learned heads have no centers
    images = load_arrays("cifar10_sample", dataset_info("cifar10_sample").eval_split)[0]
    for index in (0, 1):
        panels = _head_panels(drawn.figures[f"attention_maps_{index}"])
        assert len(panels) == 2 * 2 * 9
        expected = attention_probabilities(model, images[index])[0][0, 8 * 16 + 8].reshape(16, 16)  # (8, 8) of 16x16
        np.testing.assert_allclose(panels[0].images[0].get_array(), expected, atol=1e-6)


def test_a_preset_is_plotted_with_the_run_it_records(tmp_path):
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    run = _run_directory(tmp_path / "run", model, "cifar10", {"encoder_0": np.zeros((2, 9, 2))})
    from_run, from_preset = run_figures(run), run_figures(run / "preset")
    assert sorted(from_run.figures) == sorted(from_preset.figures)
    assert "training_curves" in from_preset.figures


def test_run_figures_need_a_run_or_a_preset(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"neither a finished training run.*source='{tmp_path}'"):
        run_figures(tmp_path)


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
    figure = viz.plot_attention_maps(model, image, queries=(5, 6))
    panel = _head_panels(figure)[0]
    drawn = panel.images[0].get_array()
    assert drawn.shape == (12, 12) and np.count_nonzero(drawn) == 49  # the 7x7 window around the query
    dashed = [p for p in panel.patches if p.get_linestyle() == "--"]
    assert len(dashed) == 1 and (dashed[0].get_x(), dashed[0].get_y(), dashed[0].get_width()) == (2.5, 1.5, 7)
    assert "the query's window" in _legend_texts(figure)


TINY = [name for name in list_models() if name.endswith("_tiny")]


@pytest.mark.parametrize("name", TINY)
def test_every_tiny_family_is_plotted_and_what_is_absent_says_why(name, tmp_path, small_npz):
    model = build_model(name, seed=0, **({} if name.startswith("resnet") else {"num_layers": 2, "image_size": 8}))
    drawn = run_figures(_run_directory(tmp_path / "run", model, small_npz))
    figures, absent = drawn.figures, drawn.absent
    kinds = {"attention_maps" if figure.startswith("attention_maps_") else figure for figure in figures}
    assert kinds | set(absent) == {"training_curves", "centers_history", "attention_centers", "attention_maps"}
    assert "training_curves" in kinds and not kinds & set(absent)
    if name.startswith("resnet"):
        assert sorted(figures) == ["training_curves"]
        assert (
            "has no attention heads" in absent["attention_centers"] and "no attention heads" in absent["attention_maps"]
        )
        return
    assert {"attention_maps_0", "attention_maps_1"} <= set(figures)
    assert len(_head_panels(figures["attention_maps_0"])) == 2 * 2 * 9  # 2 queries x 2 layers x 9 heads
    try:
        layer_centers(model)
        assert "attention_centers" in figures
    except ValueError as error:
        assert absent["attention_centers"] == str(error)


def test_figures_are_written_as_png_and_svg_into_a_directory_the_package_marks(tmp_path):
    figure = plot_training_curves({"loss": [1.0, 0.5]})
    paths = write_figures({"curves": figure}, tmp_path / "figures")
    assert [p.name for p in paths] == ["curves.png", "curves.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in paths[1].read_bytes()[:400]
    assert (tmp_path / "figures" / MARKER).exists()
    assert write_figures({"curves": figure}, tmp_path / "figures") == paths  # its own files: rewritten


def test_a_users_file_is_never_replaced_and_another_owners_directory_takes_no_figures(tmp_path):
    figure = plot_training_curves({"loss": [1.0, 0.5]})
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "curves.svg").write_text("mine")
    with pytest.raises(FileExistsError, match=f"{mine / 'curves.svg'} exists.*Received: output='{mine}'"):
        write_figures({"curves": figure}, mine)
    assert sorted(p.name for p in mine.iterdir()) == ["curves.svg"] and (mine / "curves.svg").read_text() == "mine"
    assert [p.name for p in write_figures({"other": figure}, mine)] == ["other.png", "other.svg"]  # a free name
    assert not (mine / MARKER).exists()
    write_mark(tmp_path / "preset", "preset")
    with pytest.raises(FileExistsError, match="is a preset directory: figures go into a directory of their own"):
        write_figures({"curves": figure}, tmp_path / "preset")


def test_a_runs_figures_directory_is_the_packages(tmp_path):
    run = tmp_path / "run"
    RunDirectory(run).claim()
    (run / "figures").mkdir()
    (run / "figures" / "curves.png").write_bytes(b"old")  # written by an earlier version, before the mark
    write_figures({"curves": plot_training_curves({"loss": [1.0]})}, run / "figures")
    assert (run / "figures" / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_still_training_is_drawn_from_its_best_checkpoint_so_far(tmp_path):
    import json

    run = RunDirectory(tmp_path / "run")
    run.claim()
    run.config_file.write_text(json.dumps({"dataset": "cifar10_sample", "model": "learned_tiny"}))
    run.best_checkpoint.parent.mkdir()
    build_model("learned_tiny", seed=0, **{**SMALL, "image_size": 32}).save(run.best_checkpoint)
    run.history.write_text(HISTORY_CSV)
    drawn = run_figures(run.path)  # no preset/ yet
    assert sorted(drawn.figures) == ["attention_maps_0", "attention_maps_1", "training_curves"]
    assert len(_head_panels(drawn.figures["attention_maps_0"])) == 2 * 2 * 9


@pytest.mark.parametrize("keep", [0, 100, 0.5])
def test_a_damaged_best_checkpoint_of_a_run_still_training_is_named_not_reported_missing(tmp_path, capsys, keep):
    run = RunDirectory(tmp_path / "run")
    run.claim()
    run.config_file.write_text('{"dataset": "cifar10_sample"}')
    run.best_checkpoint.parent.mkdir()
    build_model("quadratic_tiny", seed=0, **SMALL).save(run.best_checkpoint)
    whole = run.best_checkpoint.read_bytes()
    run.best_checkpoint.write_bytes(whole[: int(keep * len(whole)) if isinstance(keep, float) else keep])
    before = snapshot(tmp_path)
    assert cli.main(["plot", str(run)]) == 2
    error = capsys.readouterr().err.strip()
    assert (
        f"error: {run.best_checkpoint} cannot be loaded (not a whole .keras zip archive); it was damaged after "
        f"training wrote it. Received: run_dir='{run}'"
    ) in error, error
    assert len(error.splitlines()) == 1 and "File not found" not in error
    assert snapshot(tmp_path) == before


def test_a_runs_figures_that_links_to_a_users_folder_is_that_users_folder(tmp_path, capsys):
    # A run's figures/ that is a symbolic link is not the run's: what it points to is judged as any folder (here
    # the user's, holding the names the figures would take), and nothing in it is replaced.
    run = _run_directory(tmp_path / "run", build_model("quadratic_tiny", seed=0, **SMALL), "cifar10")
    users = tmp_path / "my_figures"
    users.mkdir()
    (users / "training_curves.png").write_bytes(b"mine")
    (users / "attention_centers.svg").write_text("mine")
    (run / "figures").symlink_to(users)
    before = snapshot(users)
    assert cli.main(["plot", str(run)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1, error
    assert f"{run / 'figures'} (a link to {users}), a directory the package did not make" in error, error
    assert snapshot(users) == before


def test_a_users_dangling_link_under_a_figures_name_is_never_replaced(tmp_path, capsys):
    run = _run_directory(tmp_path / "run", build_model("quadratic_tiny", seed=0, **SMALL), "cifar10")
    users = tmp_path / "u"
    users.mkdir()
    (users / "training_curves.png").symlink_to(tmp_path / "not-there-yet.png")
    before = snapshot(users)
    assert cli.main(["plot", str(run), "--output", str(users)]) == 2
    error = capsys.readouterr().err.strip()
    assert f"{users / 'training_curves.png'} exists" in error and f"Received: output='{users}'" in error
    assert snapshot(users) == before and not (tmp_path / "not-there-yet.png").exists()


@pytest.mark.parametrize("inside", ["sm/quadratic_tiny", "sm/new_folder", "run/preset", "run/logs"])
def test_a_folder_inside_a_directory_the_package_marked_takes_no_figures(tmp_path, capsys, inside):
    from keras_attnconv.export.root import ExportRoot

    run = _run_directory(tmp_path / "run", build_model("quadratic_tiny", seed=0, **SMALL), "cifar10")
    (run / "logs").mkdir()
    ExportRoot(tmp_path / "sm").claim()
    (tmp_path / "sm" / "quadratic_tiny" / "1").mkdir(parents=True)
    (tmp_path / "sm" / "quadratic_tiny" / "1" / "saved_model.pb").write_bytes(b"a model")
    before = snapshot(tmp_path)
    output = tmp_path / inside
    assert cli.main(["plot", str(run), "--output", str(output)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and f"Received: output='{output}'" in error, error
    assert f"{output} is" in error and "figures go into a directory of their own" in error, error
    assert snapshot(tmp_path) == before
