"""The targets the paper models' GPU training step is held to, judged on one run of the gpu suite.

Each is through ``model.fit`` (the suite's fit images/s: the epochs after
the first), in mixed_bfloat16, at batch 100 on 32x32 images, on the path
the rule picks (docs/performance.md). On an H200 they are a step's
milliseconds (100 images over fit's images/s): `quadratic` 1.5x
``torch.compile``'s step of the official code, `learned_content` 2.5x the
official code's; on an H100 they are images a second. ResNet-18 is to be no
slower than its run of record on each GPU (``training/results/gpu-h200-resnet18.json``,
``training/results/gpu-h100.json``). A run on another device, or of other
shapes, judges none of them and says so.
"""

from keras_attnconv.bench.step_targets import target_line

PRECISION = "mixed_bfloat16"
BATCH = 100
IMAGE_SIZE = 32

#: {GPU: {model: (unit, bound)}}: "ms" a fit step at most, "images/s" through fit at least.
TARGETS = {
    "H200": {
        "quadratic": ("ms", 7.7),
        "learned": ("ms", 8.0),
        "learned_content": ("ms", 22.0),
        "resnet18": ("images/s", 24_255),
    },
    "H100": {
        "quadratic": ("images/s", 12_000),
        "learned": ("images/s", 11_500),
        "learned_content": ("images/s", 4_000),
        "resnet18": ("images/s", 34_199),
    },
}


def gpu_of(device):
    """The GPU of `TARGETS` that a results file's ``device`` names (``"NVIDIA H100 80GB HBM3 (gpu)"``), or None."""
    name = device.get("device", "")
    if not name.endswith("(gpu)"):
        return None
    return next((gpu for gpu in TARGETS if gpu in name), None)


def _rule_row(rows, model):
    """The row of `model` in `PRECISION` (loss scaled as Keras does) on the path the rule picks (ResNet: its one)."""
    return next(
        (
            row
            for row in rows
            if row["model"] == model
            and row["precision"] == PRECISION
            and row.get("loss_scaling", True)
            and (row["path"] is None or row["path"] == row["auto_path"])
        ),
        None,
    )


def gpu_targets(results):
    """The targets (module docstring) that a gpu suite's `results` measure: dicts of ``target``, ``measured``,
    ``met`` and ``shortfall`` (None where met). None where the run judges none (another device, other shapes);
    a target whose row the run left out (another model, precision or path) is not listed."""
    gpu, settings = gpu_of(results["device"]), results["settings"]
    if gpu is None or (settings["batch"], settings["image_size"]) != (BATCH, IMAGE_SIZE):
        return None
    targets = []
    for model, (unit, bound) in TARGETS[gpu].items():
        row = _rule_row(results["rows"], model)
        if row is None:
            continue
        rate = row["fit_images_per_second"]
        if unit == "ms":
            step_ms = 1e3 * BATCH / rate
            met = step_ms <= bound
            target, shown = f"<= {bound:g} ms a step", f"{step_ms:.2f} ms"
            shortfall = None if met else f"{step_ms / bound:.2f}x"
        else:
            met = rate >= bound
            target, shown = f">= {bound:,} images/s", f"{rate:,.0f} images/s"
            shortfall = None if met else f"{bound / rate:.2f}x"
        path = f" ({row['path']})" if row["path"] else ""  # a ResNet has no attention path
        targets.append(
            {
                "target": f"`{model}` {PRECISION}{path} through fit on the {gpu}: {target}",
                "measured": shown,
                "met": met,
                "shortfall": shortfall,
            }
        )
    return targets


def gpu_targets_markdown(results):
    """`gpu_targets` as lines of text, or the line that says why the run judges none."""
    targets = gpu_targets(results)
    source = "keras_attnconv/bench/gpu_targets.py"
    if targets is None:
        settings = results["settings"]
        if gpu_of(results["device"]) is None:
            why = f"the device, {results['device'].get('device', 'unknown')}, is not a GPU they are set for"
        else:
            size, target = settings["image_size"], IMAGE_SIZE
            why = f"this run is of batch {settings['batch']} on {size}x{size} images, not {BATCH} on {target}x{target}"
        return f"Targets ({source}, {' and '.join(TARGETS)}): none judged: {why}."
    if not targets:
        return (
            f"Targets ({source}): none judged: this run has no row they are about ({PRECISION}, on the path the "
            f"rule picks, of {', '.join(f'`{model}`' for model in TARGETS[gpu_of(results['device'])])})."
        )
    return "\n".join([f"Targets ({source}):", *map(target_line, targets)])
