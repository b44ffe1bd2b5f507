"""What a model has learned, as arrays: centers per block, their history across epochs and resumes."""

import numpy as np
import pytest
from keras import ops

from keras_attnconv import analysis, build_model

SMALL = {"num_layers": 2, "hidden_dim": 8, "intermediate_dim": 8, "image_size": 12}


def test_layer_centers_are_each_blocks_centers_and_covariances():
    model = build_model("gaussian_tiny", seed=0, **SMALL)
    centers = analysis.layer_centers(model)
    assert list(centers) == ["encoder_0", "encoder_1"]
    score = model.get_layer("encoder_1").attention.position_score
    np.testing.assert_array_equal(centers["encoder_1"][0], ops.convert_to_numpy(score.centers))
    np.testing.assert_array_equal(centers["encoder_1"][1], score.covariances)


def test_models_without_centers_are_named():
    with pytest.raises(
        ValueError,
        match=r"^`model` must have attention heads with a center .*: its block 'encoder_0' has LearnedRelativeScore "
        r"scores\. Received: model='learned_tiny'$",
    ):
        analysis.layer_centers(build_model("learned_tiny", **SMALL))


def test_centers_history_records_each_epoch_and_survives_a_restart(tmp_path):
    model = build_model("quadratic_tiny", seed=0, **SMALL)
    model.compile(optimizer="sgd")  # the default loss: from logits
    x, y = np.random.default_rng(0).integers(0, 256, (4, 12, 12, 3), dtype=np.uint8), np.arange(4)
    history = analysis.AttentionCentersHistory(tmp_path / "centers.npz")
    model.fit(x, y, epochs=2, verbose=0, callbacks=[history])
    assert [len(v) for v in history.history.values()] == [3, 3]  # initial + 2 epochs
    assert not np.allclose(history.history["encoder_0"][0], history.history["encoder_0"][-1])
    # A run resumed from epoch 2 reads it back; one resumed from epoch 1 (its epoch 2 never backed up) redoes epoch 2.
    assert [len(v) for v in analysis.AttentionCentersHistory(tmp_path / "centers.npz", 1).history.values()] == [2, 2]
    resumed = analysis.AttentionCentersHistory(tmp_path / "centers.npz", initial_epoch=2)
    model.fit(x, y, epochs=3, initial_epoch=2, verbose=0, callbacks=[resumed])
    assert [len(v) for v in resumed.history.values()] == [4, 4]  # no second initial state
    restored = analysis.load_centers_history(tmp_path / "centers.npz")
    np.testing.assert_array_equal(restored["encoder_1"][:3], history.history["encoder_1"])
    np.testing.assert_array_equal(
        restored["encoder_1"][-1], ops.convert_to_numpy(model.get_layer("encoder_1").attention.position_score.centers)
    )


def test_a_missing_history_file_is_an_empty_history(tmp_path):
    assert analysis.load_centers_history(tmp_path / "none.npz") == {}
