"""Every model family of the zoo, saved and exported in every format, gives Keras' predictions in the real runtimes.

One tiny model per family (quadratic, gaussian, learned, learned + content, SIREN, span, local/windowed,
absolute, ResNet, quadratic with test-time flips, quadratic in a window) on 16 real CIFAR-10 images of the
embedded sample: the ``.keras`` file and the preset reload as the same model; the SavedModel in TensorFlow in a
process without keras_attnconv, the ONNX file in onnxruntime and the LiteRT file in the ai-edge-litert interpreter
give Keras' logits within 1e-4 (the SavedModel: its probabilities within 1e-5) and the same classes, from uint8
images.
"""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
from support import requires_tensorflow

from keras_attnconv import build_model, export, from_preset, save_to_preset
from keras_attnconv.training import export_source
from keras_attnconv.training.data import load_arrays

pytestmark = requires_tensorflow

#: A registered tiny model of each family, shrunk to one block where it has blocks.
FAMILIES = {
    "quadratic": "quadratic_tiny",
    "gaussian": "gaussian_tiny",
    "learned": "learned_tiny",
    "learned_content": "learned_content_tiny",
    "siren": "siren_tiny",
    "span": "quadratic_span_tiny",
    "local": "learned_content_local_tiny",
    "absolute": "absolute_learned_tiny",
    "resnet": "resnet_tiny",
    "flips": "quadratic_tiny",  # with test-time flips: the batch doubled and averaged inside the exported graph
    # Quadratic heads in a 3x3 window on the tiled path: their scores peak in each window, read per tile pair.
    "quadratic_local": "quadratic_tiny",
}
#: What shrinks each family's tiny model: one block where it has blocks.
OVERRIDES = {
    "resnet": {},
    "flips": {"num_layers": 1, "test_time_flips": True},
    "quadratic_local": {"num_layers": 1, "window": 3, "attention_options": {"windowed": True}},
}
LOGITS_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def pixels():
    return load_arrays("cifar10_sample", "validation")[0][:16]


@pytest.fixture(scope="module")
def models():
    built = {}
    for family, name in FAMILIES.items():
        overrides = OVERRIDES.get(family, {"num_layers": 1})
        built[family] = build_model(name, seed=0, dtype="float32", **overrides)
    assert built["local"].get_layer("encoder_0").attention.attention_mode == "windowed_content"
    assert built["quadratic_local"].get_layer("encoder_0").attention.attention_mode == "windowed_position"
    # Names of their own: the quadratic family's model is exported as quadratic_tiny into the same roots.
    built["flips"] = built["flips"].with_config(name="quadratic_tiny_flips")
    built["quadratic_local"] = built["quadratic_local"].with_config(name="quadratic_tiny_local")
    return built


@pytest.fixture(scope="module")
def logits(models, pixels):
    return {family: keras.ops.convert_to_numpy(model(pixels)) for family, model in models.items()}


@pytest.fixture(scope="module")
def exports(models, tmp_path_factory):
    """{format: {family: version directory}}: every family exported in every format from its preset.

    As `attnconv export` does it: the exported model is loaded from the preset, never called before.
    """
    root = tmp_path_factory.mktemp("exports")
    presets = {family: save_to_preset(model, root / "presets" / family) for family, model in models.items()}
    return {
        fmt: {family: export_source(preset, root / fmt, format=fmt) for family, preset in presets.items()}
        for fmt in export.FORMATS
    }


def assert_same_predictions(found, expected):
    np.testing.assert_allclose(found, expected, atol=LOGITS_TOLERANCE, rtol=0)
    np.testing.assert_array_equal(found.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("family", FAMILIES)
def test_keras_file_and_preset_reload_the_same_model(family, models, logits, pixels, tmp_path):
    model = models[family]
    model.save(tmp_path / "model.keras")
    preset = save_to_preset(model, tmp_path / "preset")
    for reloaded in (keras.saving.load_model(tmp_path / "model.keras"), from_preset(preset)):
        assert type(reloaded) is type(model) and reloaded.get_config() == model.get_config()
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(reloaded(pixels)), logits[family])


def test_saved_models_in_tensorflow_without_the_package(exports, logits, models, pixels, tmp_path):
    np.save(tmp_path / "pixels.npy", pixels)
    paths = {family: str(path) for family, path in exports["saved_model"].items()}
    script = textwrap.dedent(f"""
        import sys
        sys.modules["keras_attnconv"] = None  # the package must not be needed
        import numpy as np, tensorflow as tf
        pixels = tf.constant(np.load({str(tmp_path / "pixels.npy")!r}))
        outputs = {{}}
        for family, path in {paths!r}.items():
            served = tf.saved_model.load(path).signatures["serving_default"]
            out = served(images=pixels)
            outputs[family + ".probabilities"] = out["probabilities"].numpy()
            outputs[family + ".classes"] = out["classes"].numpy()
            outputs[family + ".class_names"] = np.array([n.decode() for n in out["class_names"].numpy()])
        np.savez({str(tmp_path / "out.npz")!r}, **outputs)
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    for family, expected in logits.items():
        probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(expected.astype("float64"), axis=-1))
        np.testing.assert_allclose(out[f"{family}.probabilities"], probabilities, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(out[f"{family}.classes"], expected.argmax(-1))
        names = np.array(models[family].class_names)[expected.argmax(-1)]
        assert out[f"{family}.class_names"].tolist() == names.tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_in_onnxruntime(family, exports, logits, models, pixels):
    onnxruntime = pytest.importorskip("onnxruntime")
    path = exports["onnx"][family] / "model.onnx"
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (images,), (output,) = session.get_inputs(), session.get_outputs()
    assert (images.name, images.type, output.name) == ("images", "tensor(uint8)", "logits")
    assert_same_predictions(session.run(["logits"], {"images": pixels})[0], logits[family])
    properties = session.get_modelmeta().custom_metadata_map
    assert json.loads(properties["class_names"]) == list(models[family].class_names)
    assert json.loads(properties["keras_attnconv"])["model"] == models[family].name


@pytest.mark.parametrize("family", FAMILIES)
def test_litert_in_the_interpreter(family, exports, logits, pixels):
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    interpreter = litert.Interpreter(str(exports["litert"][family] / "model.tflite"))
    (images,) = interpreter.get_input_details()
    assert images["dtype"] == np.uint8 and images["shape_signature"].tolist() == [-1, 32, 32, 3]
    interpreter.resize_tensor_input(images["index"], pixels.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(images["index"], pixels)
    interpreter.invoke()
    (output,) = interpreter.get_output_details()
    assert_same_predictions(interpreter.get_tensor(output["index"]), logits[family])


def test_litert_signature_takes_images_and_names_its_output_logits(exports, logits, pixels):
    # What metadata.json and the ONNX file say: a signature runner's user asks for "logits", not "output_0".
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    interpreter = litert.Interpreter(str(exports["litert"]["quadratic"] / "model.tflite"))
    assert interpreter.get_signature_list() == {"serving_default": {"inputs": ["images"], "outputs": ["logits"]}}
    outputs = interpreter.get_signature_runner("serving_default")(images=pixels)
    assert set(outputs) == {"logits"}
    assert_same_predictions(outputs["logits"], logits["quadratic"])


def test_each_format_records_its_signature_and_the_models_identity(exports, models):
    for fmt, paths in exports.items():
        for family, path in paths.items():
            metadata_path = path / ("assets.extra/metadata.json" if fmt == "saved_model" else "metadata.json")
            metadata = json.loads(metadata_path.read_text())
            assert (metadata["format"], metadata["model"], metadata["version"]) == (fmt, models[family].name, 1)
            assert metadata["signature"]["inputs"] == {"images": ["uint8", [None, 32, 32, 3]]}
            outputs = {
                "saved_model": {"probabilities", "classes", "class_names"},
                "onnx": {"logits"},
                "litert": {"logits"},
            }[fmt]
            assert set(metadata["signature"]["outputs"]) == outputs


def test_an_export_its_runtime_cannot_check_says_it_was_published_unchecked(monkeypatch, capsys, tmp_path):
    # LiteRT exports with TensorFlow alone; without the interpreter (the export extra) it was never run, silently.
    from keras_attnconv.export.runtimes import check_in_runtime

    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)  # as if not installed: importing it fails
    check_in_runtime(build_model("quadratic_tiny", image_size=8), tmp_path, "litert", "quadratic_tiny")
    err = capsys.readouterr().err
    assert "litert export of quadratic_tiny was not run" in err and "keras-attnconv[export]" in err


def test_the_onnx_export_shows_the_user_no_warning_of_keras_own(monkeypatch, tmp_path):
    # Keras' ONNX export probes `np.object`, which NumPy 2 answers with a FutureWarning for Keras, not the user.
    from keras_attnconv.export.formats import write_single_file

    with warnings.catch_warnings():  # as in a new process: Keras sets `np.object` after its first probe
        warnings.simplefilter("ignore", FutureWarning)  # the probe of `delattr` itself
        monkeypatch.delattr(np, "object", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_single_file(build_model("quadratic_tiny", num_layers=1, image_size=8), tmp_path, "onnx", {})
    assert (tmp_path / "model.onnx").exists()
    assert [str(warning.message) for warning in caught if "np.object" in str(warning.message)] == []
