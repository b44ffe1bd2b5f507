"""The README's reproduction commands run end to end through tensorflow-datasets, on its own mock data.

`tfds.testing.mock_data` replaces the records with random examples of the real
builder's features (uint8 32x32x3 images, int64 labels of 10 or 100 classes);
everything else is tensorflow-datasets' own: the builder, its data_dir layout,
the prepared check, the split names and `as_dataset`. The metadata a prepared
data_dir holds is written from the real builder's info, with the split sizes
of tensorflow-datasets' catalog (50,000 train and 10,000 test images).
"""

import json
from pathlib import Path

import pytest
from support import requires_tensorflow

from keras_attnconv.cli import main
from keras_attnconv.models.cifar import OFFICIAL_MEAN, OFFICIAL_STD
from keras_attnconv.training.data import dataset_info

SPLIT_SIZES = {"train": 50_000, "test": 10_000}


def prepare_metadata(name, data_dir):
    """The dataset_info.json (and features.json) of a prepared `name` under `data_dir`, without its records."""
    import tensorflow_datasets as tfds

    builder = tfds.builder(name, data_dir=str(data_dir))
    builder.info.set_splits(
        tfds.core.SplitDict(
            [tfds.core.SplitInfo(name=split, shard_lengths=[size], num_bytes=0) for split, size in SPLIT_SIZES.items()]
        )
    )
    Path(builder.data_dir).mkdir(parents=True)
    builder.info.write_to_directory(builder.data_dir)


@requires_tensorflow
@pytest.mark.parametrize("dataset, recipe", [("cifar10", "quadratic"), ("cifar100", "learned_content_official")])
def test_a_paper_recipe_trains_on_tfds_mock_data(dataset, recipe, tmp_path, capsys):
    import tensorflow_datasets as tfds

    data_dir = tmp_path / "tensorflow_datasets"
    prepare_metadata(dataset, data_dir)
    tiny = "num_layers = 1, hidden_dim = 8, intermediate_dim = 8"
    tiny = f"{{{tiny}, position_embedding_dim = 8}}" if recipe.startswith("learned") else f"{{{tiny}}}"
    with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_FILES, data_dir=str(data_dir)):
        code = main(
            [
                "train",
                "--recipe",
                recipe,
                "--dataset",
                dataset,
                "--data-dir",
                str(data_dir),
                "--epochs",
                "2",
                "--batch-size",
                "10",
                "--steps-per-epoch",
                "2",
                "--model-overrides",
                tiny,
                "--jit-compile",
                "false",  # what is checked is the data's way in: XLA's compiles would be most of the time
                "--runs-dir",
                str(tmp_path / "runs"),
                "--export-dir",
                str(tmp_path / "saved_models"),
                "--verbose",
                "0",
            ]
        )
    assert code == 0, capsys.readouterr().err
    run = tmp_path / "runs" / recipe
    config, metrics = (json.loads((run / name).read_text()) for name in ("config.json", "metrics.json"))
    assert (config["dataset"], config["schedule"], config["normalization"]) == (dataset, "official", "official")
    assert metrics["optimizer_steps"] == 4 and len(metrics["history"]["loss"]) == 2
    preset = json.loads((run / "preset" / "config.json").read_text())["config"]
    classes = dataset_info(dataset).num_classes
    assert (preset["num_classes"], preset["image_size"]) == (classes, 32)
    assert (tuple(preset["pixel_mean"]), tuple(preset["pixel_std"])) == (OFFICIAL_MEAN, OFFICIAL_STD)
    assert (tmp_path / "saved_models" / config["model"] / "1" / "saved_model.pb").exists()


@requires_tensorflow
def test_tfds_mock_data_with_its_default_policy_trains_and_real_missing_data_is_never_downloaded(tmp_path, capsys):
    # How users test their tfds pipelines: no metadata files, so tfds mocks from the builder's code (no split sizes).
    import tensorflow_datasets as tfds

    quick = [
        "train",
        "--recipe",
        "quick",
        "--dataset",
        "cifar10",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "2",
        "--jit-compile",
        "false",
        "--export-dir",
        "none",
        "--verbose",
        "0",
    ]
    with tfds.testing.mock_data(num_examples=100):
        assert main([*quick, "--run-dir", str(tmp_path / "mocked")]) == 0, capsys.readouterr().err
    assert len(json.loads((tmp_path / "mocked" / "metrics.json").read_text())["history"]["loss"]) == 1
    data_dir = tmp_path / "tensorflow_datasets"
    data_dir.mkdir()
    assert main([*quick, "--data-dir", str(data_dir), "--run-dir", str(tmp_path / "real")]) == 2
    assert f"data_dir='{data_dir}'" in capsys.readouterr().err
    assert list(data_dir.iterdir()) == [] and not (tmp_path / "real").exists()  # nothing downloaded, nothing written
