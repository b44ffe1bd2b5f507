"""The scale suite of `attnconv bench --suite scale`: training images per second on 1, 2, 4, ... devices.

Data parallelism as `attnconv train --strategy data_parallel` runs it on JAX: Keras' `DataParallel` over the
first `devices` devices, one global batch split evenly over them (the same batch and schedule as one device),
through ``model.fit`` on in-memory arrays: the median epoch of `timed_epochs` after a warm-up epoch. A row without a
distribution (``devices`` None) is the one-device run of ``--strategy default``: beside the one-device
`DataParallel` row, it shows what the distribution itself costs.

Each case runs in a fresh worker process on the JAX backend. On a machine without accelerators, XLA poses
as several CPU devices (``--xla_force_host_platform_device_count``): they share the machine's cores, each
device's part of the step on a thread of its own, so the rows say how the split batch uses those cores
(beside the one-device step, which XLA's CPU backend runs on fewer of them) plus the split's overhead,
not how separate devices scale. On a multi-GPU host, the same command measures the GPUs.
"""

import contextlib

import keras
import numpy as np

from keras_attnconv.analysis.throughput import Throughput
from keras_attnconv.bench.measure import random_images, run_in_workers
from keras_attnconv.models import build_model
from keras_attnconv.utils.reports import device_description, json_settings, write_report

SCALE_FULL = {
    "model": "quadratic",
    "precision": "mixed_bfloat16",
    "batch": 128,
    "image_size": 32,
    "devices": (1, 2, 4, 8),
    "fit_images": 128 * 20,
    "timed_epochs": 3,
}
# A small model and few images: what the CPU machine measures in a few minutes.
SCALE_QUICK = {
    "model": "quadratic_tiny",
    "precision": "float32",
    "batch": 32,
    "image_size": 32,
    "devices": (1, 2, 4),
    "fit_images": 32 * 8,
    "timed_epochs": 3,
}


def measure_scale_case(model, precision, batch, image_size, devices, fit_images, timed_epochs, **_):
    """Images per second of ``fit`` on the first `devices` devices (None: no distribution). A worker's job."""
    if keras.backend.backend() != "jax":
        raise ValueError(
            f"The scale suite measures Keras' distribution on JAX; the backend is "
            f"{keras.backend.backend()!r}. Received: KERAS_BACKEND={keras.backend.backend()!r}"
        )
    available = keras.distribution.list_devices()
    row = {
        "devices": devices,
        "device_kind": available[0].split(":")[0],
        "available": len(available),
        "batch": batch,
        "device": describe_device(),
    }
    if devices is not None and (devices > len(available) or batch % devices):
        return {
            **row,
            "skipped": f"{len(available)} devices here"
            if devices > len(available)
            else f"a batch of {batch} does not split over {devices} devices",
        }
    keras.utils.set_random_seed(0)
    distribution = keras.distribution.DataParallel(devices=available[:devices]) if devices is not None else None
    images = random_images(fit_images, image_size, seed=1)
    labels = (np.arange(fit_images) % 10).astype("int32")
    throughput = Throughput(fit_images)
    with distribution.scope() if distribution is not None else contextlib.nullcontext():
        built = build_model(model, seed=0, dtype=precision, image_size=image_size)
        built.compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=True,
        )
        # The epoch's end waits for the devices (its logs are read on the host); the first epoch is the warm-up.
        built.fit(
            images, labels, batch_size=batch, epochs=1 + timed_epochs, shuffle=False, verbose=0, callbacks=[throughput]
        )
    return {**row, "images_per_second": throughput.images_per_second, "per_device_batch": batch // (devices or 1)}


def run_scale_benchmark(quick=False, output="bench-scale.json", command=None, **overrides):
    """Runs the scale suite, one worker per device count, one at a time; writes JSON and a markdown table."""
    settings = json_settings({**(SCALE_QUICK if quick else SCALE_FULL), **overrides})
    # Where there is no accelerator, the CPU poses as the largest count of devices (a flag only the CPU reads).
    environment = {
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={max(settings['devices'])}",
    }
    counts = [None, *settings["devices"]]
    rows = run_in_workers(
        "scale-case", [{**settings, "devices": n} for n in counts], concurrently=False, environment=environment
    )
    device = [row.pop("device") for row in rows][0]  # one machine: every worker describes the same
    results = {"command": command, "device": device, "settings": settings, "rows": rows}
    write_report(output, results, scale_markdown(results))
    return results


def describe_device():
    """The device of the worker (JAX's), with the package versions and the CPU's model."""
    description = device_description()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:  # not Linux: the processor's name from `platform`
        names = []
    return {**description, "cpu_model": names[0] if names else description.get("processor")}


def scale_markdown(results):
    device, settings = results["device"], results["settings"]
    cpu = results["rows"][0]["device_kind"] == "cpu"
    lines = [
        f"Device: {device['device']}; CPU {device.get('cpu_model')}, {device.get('cpus')} cores; backend "
        f"{device['backend']}, jax {device.get('jax')}, keras {device.get('keras')}.",
        f"Command: `{results['command']}`" if results.get("command") else None,
        f"`{settings['model']}`, {settings['precision']}, a global batch of {settings['batch']} "
        f"{settings['image_size']}x{settings['image_size']}x3 images split over the devices, XLA; "
        f"`fit`: the median of {settings['timed_epochs']} epochs of {settings['fit_images']} images after a "
        "warm-up epoch.",
        "Simulated CPU devices share this machine's cores, each on a thread of its own: the rows show how the "
        "split batch uses those cores and what the split costs, not a speed-up of separate devices."
        if cpu
        else None,
        "",
        "| devices | per-device batch | images/s | vs one device |",
        "|---|---|---|---|",
    ]
    baseline = results["rows"][0].get("images_per_second")
    for row in results["rows"]:
        name = "1, no distribution" if row["devices"] is None else str(row["devices"])
        if "skipped" in row:
            lines.append(f"| {name} | - | skipped: {row['skipped']} | - |")
            continue
        ratio = row["images_per_second"] / baseline if baseline else float("nan")
        lines.append(f"| {name} | {row['per_device_batch']} | {row['images_per_second']:.0f} | {ratio:.2f}x |")
    return "\n".join(line for line in lines if line is not None)
