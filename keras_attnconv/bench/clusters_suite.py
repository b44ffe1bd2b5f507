"""The clusters suite of `attnconv bench --suite clusters`: the graph step with and without element-wise XLA clusters.

TensorFlow reads ``TF_XLA_FLAGS`` once, when its runtime starts, so the two
cases cannot run in one process: each round runs every model's graph step
(``jit_compile=False``) in a fresh worker process without the flags, then in
one with them (`keras_attnconv.models.element_clusters.FLAGS`), one worker
at a time, and the table gives the medians over the rounds and their ratio.
This is what `element_clusters.takes_element_clusters` stands on; a
``TF_XLA_FLAGS`` of the user's is set aside for both cases.
"""

import statistics
import time

import keras
import numpy as np

from keras_attnconv.bench.measure import random_images, run_in_workers
from keras_attnconv.models import build_model, element_clusters, get_model_config
from keras_attnconv.models.precision import check_precisions
from keras_attnconv.utils.reports import json_settings, machine, machine_text, write_report

CLUSTERS_FULL = {
    "models": ("quadratic", "learned", "learned_content", "learned_content_local", "resnet18"),
    "precisions": ("mixed_bfloat16", "float32"),
    "batch": 16,
    "warmup": 3,
    "repeats": 5,
    "rounds": 2,
}
# Tiny shapes, a smoke test of the workers and the table (it runs in the CPU test suite): not a measurement.
CLUSTERS_QUICK = {**CLUSTERS_FULL, "models": ("quadratic_tiny",), "precisions": ("mixed_bfloat16",)}
CLUSTERS_QUICK.update(batch=2, warmup=1, repeats=2, rounds=1)


def graph_step_case(model, precision, batch, warmup, repeats, **_):
    """A worker's case: the median ms of `model`'s training step in TensorFlow's graph, and whether the process'
    ``TF_XLA_FLAGS`` clustered its element-wise ops."""
    built = build_model(model, seed=0, dtype=precision)
    built.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    config = get_model_config(model)
    x, y = random_images(batch, config.image_size), np.arange(batch) % config.num_classes
    for _ in range(warmup):
        built.train_on_batch(x, y)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        built.train_on_batch(x, y)
        seconds.append(time.perf_counter() - start)
    return {"step_ms": 1e3 * statistics.median(seconds), "element_clusters": element_clusters.in_effect()}


def run_clusters_benchmark(quick=False, output="bench-clusters.json", **overrides):
    """Runs every (model, precision) case without and with the clusters, in turns; writes JSON and a table."""
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "the clusters suite times TensorFlow's graph step: run it with KERAS_BACKEND=tensorflow. "
            f"Received: backend {keras.backend.backend()!r}"
        )
    settings = json_settings({**(CLUSTERS_QUICK if quick else CLUSTERS_FULL), **overrides})
    check_precisions(settings["precisions"])
    for model in settings["models"]:
        get_model_config(model)  # an unknown name (with the closest ones) fails here, before any worker
    flags = {clustered: element_clusters.worker_environment(clustered) for clustered in (False, True)}
    cases = [(model, precision) for precision in settings["precisions"] for model in settings["models"]]
    times = {(case, clustered): [] for case in cases for clustered in flags}
    for _ in range(settings["rounds"]):
        for model, precision in cases:
            for clustered, environment in flags.items():
                case = {**settings, "model": model, "precision": precision}
                (result,) = run_in_workers("graph-step", [case], concurrently=False, environment=environment)
                if result["element_clusters"] != clustered:
                    raise RuntimeError(f"a worker's TF_XLA_FLAGS did not take: {result} for {case}")
                times[((model, precision), clustered)].append(result["step_ms"])
    measured_on, rows = machine(), []
    for model, precision in cases:
        plain_rounds, clustered_rounds = (times[((model, precision), c)] for c in (False, True))
        plain, clustered = statistics.median(plain_rounds), statistics.median(clustered_rounds)
        rows.append(
            {
                "model": model,
                "precision": precision,
                "graph_ms": plain,
                "clustered_ms": clustered,
                # Each round's, as a machine's runs move (by 10% and more between rounds on a 2-core EPYC).
                "graph_ms_rounds": plain_rounds,
                "clustered_ms_rounds": clustered_rounds,
                "speedup": plain / clustered,
                "takes_them": element_clusters.takes_element_clusters(
                    "tensorflow",
                    precision,
                    "auto",
                    element_clusters.clustered_precisions(model),
                    measured_on["cpu"]["bfloat16_units"],
                ),
            }
        )
    results = {"machine": measured_on, "settings": settings, "flags": list(element_clusters.FLAGS), "rows": rows}
    write_report(output, results, clusters_markdown(results))
    return results


def clusters_markdown(results):
    settings = results["settings"]
    lines = [
        f"Machine: {machine_text(results['machine'])}; Keras {results['machine']['keras']} on "
        f"{results['machine']['backend']}.",
        "",
        f"Training step in TensorFlow's graph (`jit_compile=False`), batch {settings['batch']}, median of "
        f"{settings['repeats']} steps after {settings['warmup']}, in a fresh worker process per case; "
        f'{settings["rounds"]} rounds, each case without then with `TF_XLA_FLAGS="{" ".join(results["flags"])}"` '
        "(medians over the rounds). Taken: whether `attnconv train` sets them for such a run on this CPU "
        "(keras_attnconv/models/element_clusters.py).",
        "",
        "| model | precision | graph ms | with clusters ms | speed-up | taken |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| `{row['model']}` | {row['precision']} | {row['graph_ms']:.0f} | {row['clustered_ms']:.0f} "
        f"| {row['speedup']:.2f}x | {'yes' if row['takes_them'] else ''} |"
        for row in results["rows"]
    ]
    return "\n".join(lines)
