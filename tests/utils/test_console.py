"""utils.console: what the package keeps off the terminal, and only that."""

import logging
import os
import subprocess
import sys

from keras_attnconv.utils.console import retracing_warnings_off


def test_retracing_warnings_off_drops_only_the_retracing_warning_and_only_within_the_block(caplog):
    logger = logging.getLogger("tensorflow")
    retracing = "5 out of the last 5 calls to <function one_step_on_data> triggered tf.function retracing."
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        with retracing_warnings_off():
            logger.warning(retracing)
            logger.warning("Another warning of TensorFlow's")
        logger.warning(retracing)
    assert [record.getMessage() for record in caplog.records] == ["Another warning of TensorFlow's", retracing]


def test_a_notebook_that_imports_the_package_first_sees_no_native_start_up_lines():
    # The import starts Keras' backend within the filter. TensorFlow probes CUDA at its first operation, not at its
    # import: on a machine without a GPU its "failed call to cuInit" error line came with the first model call.
    script = (
        "import numpy as np, keras_attnconv\n"
        "model = keras_attnconv.build_model('quadratic_tiny', num_layers=1, hidden_dim=8, intermediate_dim=8)\n"
        "print(model(np.zeros((1, 32, 32, 3), np.uint8)).shape)"
    )
    environment = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=environment, check=False
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("(1, 10)"), result.stderr
    assert result.stderr == ""
