"""Reports of measurements: a JSON file and its markdown twin, with the machine they were measured on."""

import functools
import hashlib
import os
import pathlib
import platform

from keras_attnconv.utils.files import write_atomically, write_json

# The CPU flags (Linux's /proc/cpuinfo names) of bfloat16 arithmetic units, fastest first.
BFLOAT16_UNITS = {"amx_bf16": "AMX", "avx512_bf16": "AVX-512 BF16"}
# The vector units reported beside CPU figures, widest first.
VECTOR_UNITS = {"avx512f": "AVX-512", "avx2": "AVX2"}


def report_paths(output):
    """The JSON and markdown files of a report written to `output`: ``(X.json, X.md)`` whichever of them is given.

    Any other name is the JSON file, with the markdown beside it as ``X.md``:
    never one file for both formats.
    """
    base, suffix = os.path.splitext(os.fspath(output))
    json_path = f"{base}.json" if suffix.lower() == ".md" else os.fspath(output)
    return json_path, f"{base}.md"


def json_settings(settings):
    """`settings` as a results file holds them (tuples as lists), so that a rerun's compare equal to a file's."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}


def code_digest():
    """A digest of the package's Python sources: which code measured a results file's rows."""
    package = pathlib.Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def package_revision():
    """``{"version", "commit"}`` of the package that runs: its version, and the git commit of its checkout.

    The commit is None for an installed package (no checkout), and ends in ``+changes`` where the checkout's
    package or tests differ from it: results files say which code made them.
    """
    import importlib.metadata
    import subprocess

    try:
        version = importlib.metadata.version("keras-attnconv")  # not `version.py`: utils imports no other entry
    except importlib.metadata.PackageNotFoundError:  # sources on the path, not installed
        version = None
    root = pathlib.Path(__file__).resolve().parents[2]
    commit = None
    if (root / ".git").exists():

        def git(*args):
            return subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, check=False
            ).stdout.strip()

        try:
            commit = git("rev-parse", "--short", "HEAD") or None
            if commit and git("status", "--porcelain", "--", "keras_attnconv", "tests"):
                commit += "+changes"
        except OSError:  # no git on this machine
            commit = None
    return {"version": version, "commit": commit}


def write_report(output, results, markdown):
    """Writes `results` as JSON and the `markdown` text beside it, each atomically (`report_paths`)."""
    json_path, markdown_path = report_paths(output)
    write_json(json_path, results)
    write_atomically(markdown_path, lambda tmp: tmp.write_text(markdown.rstrip("\n") + "\n"))


def machine():
    """The machine and software a measurement ran on, for results files."""
    import keras  # here, not at the top: the rest of this module must not load a framework

    return {
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "cpus_usable": usable_cpus(),
        "platform": platform.platform(),
        "cpu": _cpu_report(),
    }


def usable_cpus():
    """The CPUs this process may run on (`taskset`, a container's CPU set), which size the frameworks' thread
    pools: fewer than the machine's where the process was confined."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _cpu_report():
    """`cpu_capabilities` as JSON: the flags as a sorted list."""
    capabilities = cpu_capabilities()
    return {**capabilities, "flags": sorted(capabilities["flags"])}


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
        description.update(
            device=f"{device.device_kind} ({device.platform})", jax=jax.__version__, jaxlib=jaxlib.__version__
        )
    elif backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else None
        description.update(
            device=f"{name} (gpu)" if gpus else f"{cpu_capabilities()['model']} (cpu)", tensorflow=tf.__version__
        )
    else:
        description["device"] = "unknown"
    return description


@functools.cache
def cpu_capabilities(cpuinfo="/proc/cpuinfo"):
    """This CPU's model, its bfloat16 units and widest vector unit, from `cpuinfo` (Linux; unknown elsewhere).

    Returns a dict: ``model``; ``bfloat16_units`` (``"AMX"``, ``"AVX-512 BF16"`` or None: no hardware
    bfloat16 arithmetic, where oneDNN converts to float32); ``vector_units``; ``flags`` (the relevant
    flags the CPU has, a frozenset).
    """
    model, flags = "unknown", frozenset()
    try:
        with open(cpuinfo) as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = frozenset(value.split()) & (set(BFLOAT16_UNITS) | set(VECTOR_UNITS))
    except OSError:
        pass
    return {
        "model": model,
        "bfloat16_units": next((name for flag, name in BFLOAT16_UNITS.items() if flag in flags), None),
        "vector_units": next((name for flag, name in VECTOR_UNITS.items() if flag in flags), None),
        "flags": flags,
    }
