"""`import keras_attnconv` alone registers every serializable class of the package with Keras, eagerly."""

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "keras_attnconv"


def _decorated_classes():
    """The classes the package's source decorates with ``keras.saving.register_keras_serializable``."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                "register_keras_serializable" in ast.unparse(decorator) for decorator in node.decorator_list
            ):
                names.add(node.name)
    return names


def test_importing_the_package_registers_every_serializable_class_in_a_fresh_process():
    script = (
        "import json, keras, keras_attnconv\n"
        "print(json.dumps(sorted(k.split('>')[1] for k in keras.saving.get_custom_objects() "
        "if k.startswith('keras_attnconv>'))))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    registered = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert {"RelativeMultiHeadAttention", "AttentionClassifier", "CoupledWeightDecaySGD"} <= registered
    assert registered == _decorated_classes()


def test_a_saved_model_loads_after_importing_the_package_alone(tmp_path):
    from support import tiny_model

    path = tmp_path / "model.keras"
    tiny_model().save(path)
    script = (
        f"import keras, keras_attnconv\nmodel = keras.saving.load_model({str(path)!r})\nprint(type(model).__name__)"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == type(tiny_model()).__name__
