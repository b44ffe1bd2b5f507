"""The attention classifier family: its configurations' paper sizes and score terms, and the model contract."""

import keras
import numpy as np
import pytest
from support import MODEL_CHECKS, family_cases

import keras_attnconv
from keras_attnconv.models.summary import trainable_parameters

PAPER_SIZES = {
    "quadratic": 12.1,
    "gaussian": 12.1,
    "gaussian_pruned": 9.7,
    "learned": 12.3,
    "learned_content": 29.5,
    "learned_content_official": 29.5,
}


@pytest.mark.parametrize("name", sorted(PAPER_SIZES))
def test_parameter_count_within_one_percent_of_the_paper(name):
    params = trainable_parameters(keras_attnconv.build_model(name)) / 1e6
    assert params == pytest.approx(PAPER_SIZES[name], rel=0.01)
    assert keras_attnconv.get_paper_figures(name).params_millions == PAPER_SIZES[name]


# The two "learned emb. + content" models: score terms (content-content, content-position, key bias,
# position bias), the row/column table size per axis, and the trainable parameters.
LEARNED_CONTENT_MODELS = {
    # The paper's text (section 4.3): q.k + q.r on tables of 200 per axis, no position bias.
    "learned_content": ((True, True, False, False), 200, 29_484_282),
    # The official code's model (`--use_attention_data True`): q.k + the position-only score of `learned`.
    "learned_content_official": ((True, False, False, True), 400, 29_601_882),
}


@pytest.mark.parametrize("name", sorted(LEARNED_CONTENT_MODELS))
def test_both_learned_content_models_score_what_their_source_says(name):
    terms, axis_dim, params = LEARNED_CONTENT_MODELS[name]
    model = keras_attnconv.build_model(name)
    attention = [layer.attention for layer in model.layers if hasattr(layer, "attention")]
    assert len(attention) == 6
    for layer in attention:
        assert (
            layer.use_content_content,
            layer.use_content_position,
            layer.use_key_bias,
            layer.use_position_bias,
        ) == terms
        assert layer.position_score.axis_dim == axis_dim
    assert trainable_parameters(model) == params


def test_pruned_model_has_the_appendix_e_heads():
    model = keras_attnconv.build_model("gaussian_pruned")
    heads = [layer.attention.num_heads for layer in model.layers if hasattr(layer, "attention")]
    assert heads == [7, 5, 8, 7, 3, 9]  # [2, 4, 1, 2, 6, 0] of 9 pruned


@pytest.mark.parametrize("check", MODEL_CHECKS)
@pytest.mark.parametrize("case", family_cases("AttentionClassifier"), ids=lambda case: case.name)
def test_every_configuration_meets_the_model_contract(case, check):
    MODEL_CHECKS[check](case)


def batch(size=4, image_size=8):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (size, image_size, image_size, 3), dtype=np.uint8), rng.integers(0, 10, size)


@pytest.mark.parametrize(
    "name, spec",
    [
        ("learned_content_local_tiny", ((7, 7), (1, 1), False)),
        ("absolute_learned_local_tiny", ((7, 7), (1, 1), False)),
        ("quadratic_span_local_tiny", ((7, 7), (1, 1), False)),
    ],
)
def test_local_models_attend_in_a_7x7_window_and_keep_it_through_a_keras_file(name, spec, tmp_path):
    model = keras_attnconv.build_model(name, seed=0, num_layers=1, image_size=16)
    attention = model.get_layer("encoder_0").attention
    assert attention.window_spec == spec
    global_twin = keras_attnconv.build_model(name.replace("_local", ""), num_layers=1, image_size=16)
    assert global_twin.get_layer("encoder_0").attention.window_spec is None
    path = tmp_path / "model.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert reloaded.get_layer("encoder_0").attention.window_spec == spec
    x, _ = batch(2, 16)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded(x)), keras.ops.convert_to_numpy(model(x)), atol=1e-6)


def test_rematerialize_reaches_every_block_and_attention_layer_and_survives_a_keras_file(tmp_path):
    model = keras_attnconv.build_model("learned_content_local_tiny", num_layers=2, image_size=16, rematerialize=True)
    path = tmp_path / "model.keras"
    model.save(path)
    for built in (model, keras.saving.load_model(path)):
        blocks = [built.get_layer(f"encoder_{i}") for i in range(2)]
        assert [(block.rematerialize, block.attention.rematerialize) for block in blocks] == [(True, True)] * 2
    default = keras_attnconv.build_model("learned_content_local_tiny", num_layers=1, image_size=16)
    assert (default.get_layer("encoder_0").rematerialize, default.get_layer("encoder_0").attention.rematerialize) == (
        False,
        False,
    )
    # Global attention has no windowed tensors to recompute; its blocks still recompute their feed-forward layers.
    global_model = keras_attnconv.build_model("learned_content_tiny", num_layers=1, image_size=16, rematerialize=True)
    assert global_model.get_layer("encoder_0").rematerialize


def test_window_from_a_recipe_list_is_a_tuple():
    config = keras_attnconv.get_model_config("learned_content", window=[7, 5], dilation=[1, 2])
    assert (config.window, config.dilation) == ((7, 5), (1, 2))
    hash(config)  # still a frozen, hashable config
