"""Keeps the native libraries' start-up logs off the terminal of the `attnconv` command.

TensorFlow and XLA log from C++ through absl before absl is initialised, so
``TF_CPP_MIN_LOG_LEVEL`` does not reach messages such as "Could not find cuda
drivers on your machine" or the CPU feature notice: they go straight to file
descriptor 2. `native_log_filter` routes that descriptor through a pipe and
drops only those known start-up lines; every other line (Python errors and
warnings, native errors) is passed on unchanged.
"""

import contextlib
import logging
import os
import re
import sys
import threading

#: Lines that say nothing to a user of a CPU machine: absl's preamble, glog-style
#: info/warning lines ("I0000 00:00:... file.cc:31] ...", before TensorFlow 2.20
#: "2026-12-07 13:31:54.357065: I tensorflow/...cc:153] ..."), the CPU feature notice,
#: the LiteRT interpreter's notice of its CPU delegate (a LiteRT export is run once
#: to check it) and CUDA probing on a machine without a GPU.
START_UP_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\]"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] \S+:\d+\]"  # TensorFlow 2.19's format of them
    r"|To enable the following instructions:"
    r"|INFO: Created TensorFlow Lite XNNPACK delegate for CPU\.$"
    r"|.*(failed call to cuInit|Could not find cuda drivers|cuda_(driver|diagnostics)\.cc|Unable to register cu))"
)


@contextlib.contextmanager
def native_log_filter(pattern=START_UP_NOISE):
    """Within the block, lines written to file descriptor 2 that match `pattern` are dropped."""
    try:
        sys.stderr.flush()
        terminal = os.dup(2)
    except (OSError, ValueError):  # no usable descriptor 2 (embedded interpreter): nothing to filter
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward():
        with os.fdopen(read_end, "rb") as pipe:
            for line in pipe:
                if not pattern.match(line.decode("utf-8", "replace")):
                    os.write(terminal, line)

    thread = threading.Thread(target=forward, name="native-log-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(terminal, 2)  # closes our write end of the pipe: the reader drains it and stops
        thread.join(timeout=5)
        os.close(terminal)


@contextlib.contextmanager
def retracing_warnings_off():
    """Within the block, TensorFlow's warning that a function "triggered tf.function retracing" is dropped.

    TensorFlow counts the traces of Keras' step function across models: a suite that builds one model per
    precision and path traces it anew for each, as it must, and from the fifth model on the warning blames
    a loop that is meant. Every other message of TensorFlow's logger passes.
    """
    logger = logging.getLogger("tensorflow")

    def keep(record):
        return "triggered tf.function retracing" not in record.getMessage()

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)
