"""utils.console: what the package keeps off the terminal, and only that."""

import logging

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
