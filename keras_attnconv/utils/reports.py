"""Reports of measurements: a JSON file and its markdown twin, with the machine they were measured on."""

import os
import platform

from keras_attnconv.utils.files import write_atomically, write_json


def report_paths(output):
    """The JSON and markdown files of a report written to `output`: ``(X.json, X.md)`` whichever of them is given.

    Any other name is the JSON file, with the markdown beside it as ``X.md``:
    never one file for both formats.
    """
    base, suffix = os.path.splitext(os.fspath(output))
    json_path = f"{base}.json" if suffix.lower() == ".md" else os.fspath(output)
    return json_path, f"{base}.md"


def write_report(output, results, markdown):
    """Writes `results` as JSON and the `markdown` text beside it, each atomically (`report_paths`)."""
    json_path, markdown_path = report_paths(output)
    write_json(json_path, results)
    write_atomically(markdown_path, lambda tmp: tmp.write_text(markdown.rstrip("\n") + "\n"))


def machine():
    """The machine and software a measurement ran on, for results files."""
    import keras  # here, not at the top: the rest of this module must not load a framework

    return {"backend": keras.backend.backend(), "keras": keras.__version__, "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "platform": platform.platform()}


def device_description():
    """The device the backend computes on, the backend's version and the machine (for results files)."""
    import keras  # here, not at the top: the rest of this module must not load a framework
    import numpy as np

    backend = keras.backend.backend()
    description = {**machine(), "numpy": np.__version__}
    if backend == "jax":
        import jax
        import jaxlib

        device = jax.local_devices()[0]
        description.update(device=f"{device.device_kind} ({device.platform})", jax=jax.__version__,
                           jaxlib=jaxlib.__version__)
    elif backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else None
        description.update(device=f"{name} (gpu)" if gpus else f"{platform.processor() or 'CPU'} (cpu)",
                           tensorflow=tf.__version__)
    else:
        description["device"] = "unknown"
    return description
