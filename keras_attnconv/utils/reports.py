"""Reports of measurements: a JSON file and its markdown twin, with the machine and code that measured them."""

import functools
import hashlib
import importlib.metadata
import os
import pathlib
import platform
import sys

from keras_attnconv.utils.files import write_atomically, write_json

# The CPU flags (Linux's /proc/cpuinfo names) of bfloat16 arithmetic units, fastest first.
BFLOAT16_UNITS = {"amx_bf16": "AMX", "avx512_bf16": "AVX-512 BF16"}
# The vector units reported beside CPU figures, widest first.
VECTOR_UNITS = {"avx512f": "AVX-512", "avx2": "AVX2"}
# The libraries each Keras backend computes with, whose versions a results file records beside Keras' and NumPy's.
BACKEND_LIBRARIES = {"jax": ("jax", "jaxlib"), "tensorflow": ("tensorflow",), "torch": ("torch",), "numpy": ()}


def report_paths(output):
    """The JSON and markdown files of a report written to `output`: ``(X.json, X.md)`` whichever of them is given.

    Any other name is the JSON file, with the markdown beside it as ``X.md``:
    never one file for both formats.
    """
    base, suffix = os.path.splitext(os.fspath(output))
    json_path = f"{base}.json" if suffix.lower() == ".md" else os.fspath(output)
    return json_path, f"{base}.md"


def percent(value, digits=1):
    """An accuracy as the tables show it (``88.77%``), or "-" where there is none (a figure a finished run lacks)."""
    return "-" if value is None else f"{100 * value:.{digits}f}%"


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


def library_versions(backend=None):
    """The versions of Keras, NumPy and the libraries of `backend` (default: the running one), by module name.

    A library this process has loaded gives its own ``__version__``; another one (the backend of a worker
    process, where it is not this process's) the version of its installed distribution, None if none is.
    """
    import keras  # here, not at the top: the rest of this module must not load a framework

    names = ("keras", "numpy", *BACKEND_LIBRARIES.get(backend or keras.backend.backend(), ()))
    return {name: _module_version(name) for name in names}


def _module_version(name):
    module = sys.modules.get(name)
    if getattr(module, "__version__", None):
        return module.__version__
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def record_provenance(results):
    """Adds to the dict `results` what produced them, and returns it: every results file says so.

    ``"package"``: the package's version and git commit (`package_revision`), the code that writes the file,
    replacing an earlier one's. The versions of Keras, NumPy and the backend's libraries (`library_versions`,
    of the backend the results name) go into the results' own record of where they ran, ``"device"``
    (`device_description`) or else ``"machine"`` (`machine`), as far as it lacks them: a record from a
    worker process keeps the worker's versions. Results with neither record get them as ``"libraries"``.
    """
    records = [key for key in ("device", "machine") if isinstance(results.get(key), dict)]
    recorded = {name: value for key in records for name, value in results[key].items()}
    backend = recorded.get("backend")
    missing = {name: v for name, v in library_versions(backend).items() if name not in recorded}
    if missing:
        key = records[0] if records else "libraries"
        # A new dict, not an update of the suite's own: a worker's record may be shared with other results.
        results[key] = {**results.get(key, {}), **missing}
    results["package"] = package_revision()
    return results


def write_report(output, results, markdown):
    """Writes `results` as JSON and the `markdown` text beside it, each atomically (`report_paths`).

    The JSON says what produced it (`record_provenance`): the package's revision and the libraries' versions,
    added to `results` itself, so that the results a suite returns are the ones it wrote.
    """
    record_provenance(results)
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
        "compiler_flags": compiler_flags(),
    }


#: Variables that change what a compiled step runs (XLA's options; TensorFlow's clusters, `element_clusters`).
COMPILER_FLAG_VARIABLES = ("TF_XLA_FLAGS", "XLA_FLAGS")


def compiler_flags(environ=None):
    """The `COMPILER_FLAG_VARIABLES` set in `environ` (default: the process'), by name: what a measurement
    ran with beside the code and the machine."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in COMPILER_FLAG_VARIABLES if name in environ}


def machine_text(machine):
    """The CPU a report was measured on: its model (with its family and model numbers, where recorded), CPU count
    (and how many the process could use, where fewer) and what it has for bfloat16 and vectors."""
    cpu = machine.get("cpu") or {}
    usable = machine.get("cpus_usable", machine["cpus"])  # not recorded before: all of them
    confined = f", {usable} of them usable by the process" if usable != machine["cpus"] else ""
    numbers = f" (family {cpu['family']}, model {cpu['model_number']})" if cpu.get("family") is not None else ""
    flags = "".join(f"; {name}={value!r}" for name, value in (machine.get("compiler_flags") or {}).items())
    return (
        f"{cpu.get('model', machine['processor'])}{numbers}, {machine['cpus']} CPUs{confined} "
        f"(bfloat16 units: {cpu.get('bfloat16_units') or 'none'}; vectors: {cpu.get('vector_units') or '?'})"
        f"{flags}"
    )


def device_text(device):
    """The device of a `device_description`; on a CPU with its model and what it has for bfloat16 and vectors
    (a CPU's figures mean nothing without them; a file written before the machine was recorded: the name alone)."""
    on_cpu = device["device"].endswith("(cpu)") and "cpus" in device
    return f"{device['device']}: {machine_text(device)}" if on_cpu else device["device"]


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

    backend = keras.backend.backend()
    description = {**machine(), **library_versions(backend)}
    if backend == "jax":
        import jax

        device = jax.local_devices()[0]
        description["device"] = f"{device.device_kind} ({device.platform})"
    elif backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else None
        description["device"] = f"{name} (gpu)" if gpus else f"{cpu_capabilities()['model']} (cpu)"
    else:
        description["device"] = "unknown"
    return description


@functools.cache
def cpu_capabilities(cpuinfo="/proc/cpuinfo"):
    """This CPU's model, its bfloat16 units and widest vector unit, from `cpuinfo` (Linux; unknown elsewhere).

    Returns a dict: ``model``; ``family`` and ``model_number`` (the CPU's family and model numbers, or
    None: a virtual machine's model name may be the vendor's line alone, "AMD EPYC" for each of its
    generations, which these tell apart); ``bfloat16_units`` (``"AMX"``, ``"AVX-512 BF16"`` or None: no
    hardware bfloat16 arithmetic, where oneDNN converts to float32); ``vector_units``; ``flags`` (the
    relevant flags the CPU has, a frozenset).
    """
    model, flags, numbers = "unknown", frozenset(), {}
    try:
        with open(cpuinfo) as lines:
            for line in lines:
                key, _, value = (part.strip() for part in line.partition(":"))
                if key == "model name" and model == "unknown":
                    model = value
                elif key in ("cpu family", "model") and value.isdigit():
                    numbers.setdefault(key, int(value))
                elif key == "flags" and not flags:
                    flags = frozenset(value.split()) & (set(BFLOAT16_UNITS) | set(VECTOR_UNITS))
    except OSError:
        pass
    return {
        "model": model,
        "family": numbers.get("cpu family"),
        "model_number": numbers.get("model"),
        "bfloat16_units": next((name for flag, name in BFLOAT16_UNITS.items() if flag in flags), None),
        "vector_units": next((name for flag, name in VECTOR_UNITS.items() if flag in flags), None),
        "flags": flags,
    }
