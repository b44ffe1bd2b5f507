"""The GPU step's targets are judged on the row they are about, in their own unit, and only where they apply."""

import pytest

from keras_attnconv.bench import gpu_targets


def row(model, fit_images_per_second, path=None, auto_path=None, precision="mixed_bfloat16", loss_scaling=True):
    return {
        "model": model,
        "path": path,
        "auto_path": auto_path,
        "precision": precision,
        "loss_scaling": loss_scaling,
        "fit_images_per_second": fit_images_per_second,
    }


def results(device, rows, batch=100, image_size=32):
    return {"device": {"device": device}, "settings": {"batch": batch, "image_size": image_size}, "rows": rows}


def test_each_target_is_judged_on_the_rule_paths_mixed_bfloat16_row_through_fit():
    rows = [
        row("quadratic", 20_000, path="separable", auto_path="position"),  # not the rule's path: not judged
        row("quadratic", 14_000, path="position", auto_path="position"),  # 7.14 ms a step
        row("learned", 11_000, path="position", auto_path="position"),  # 9.09 ms
        row("learned", 30_000, path="position", auto_path="position", precision="float32"),  # another precision
        row("resnet18", 20_000),
    ]
    judged = gpu_targets.gpu_targets(results("NVIDIA H200 (gpu)", rows))
    assert judged == [  # learned_content has no row: not listed
        {
            "target": "`quadratic` mixed_bfloat16 (position) through fit on the H200: <= 7.7 ms a step",
            "measured": "7.14 ms",
            "met": True,
            "shortfall": None,
        },
        {
            "target": "`learned` mixed_bfloat16 (position) through fit on the H200: <= 8 ms a step",
            "measured": "9.09 ms",
            "met": False,
            "shortfall": "1.14x",
        },
        {
            "target": "`resnet18` mixed_bfloat16 through fit on the H200: >= 24,255 images/s",
            "measured": "20,000 images/s",
            "met": False,
            "shortfall": "1.21x",
        },
    ]


def test_an_h100s_targets_are_images_a_second_and_the_markdown_says_met_or_missed():
    rows = [
        row("learned_content", 4_100, path="content", auto_path="content"),
        row("quadratic", 9_600, "position", "position"),
    ]
    text = gpu_targets.gpu_targets_markdown(results("NVIDIA H100 80GB HBM3 (gpu)", rows))
    assert text.splitlines() == [
        "Targets (keras_attnconv/bench/gpu_targets.py):",
        "- `quadratic` mixed_bfloat16 (position) through fit on the H100: >= 12,000 images/s: 9,600 images/s, "
        "missed by 1.25x",
        "- `learned_content` mixed_bfloat16 (content) through fit on the H100: >= 4,000 images/s: 4,100 images/s, met",
    ]


@pytest.mark.parametrize(
    "run, why",
    [
        (results("cpu (cpu)", [row("resnet18", 50)]), "the device, cpu (cpu), is not a GPU they are set for"),
        (results("NVIDIA A100-SXM4-80GB (gpu)", [row("resnet18", 9_000)]), "the device, NVIDIA A100-SXM4-80GB (gpu),"),
        (
            results("NVIDIA H200 (gpu)", [row("resnet18", 9_000)], image_size=64),
            "this run is of batch 100 on 64x64 images, not 100 on 32x32",
        ),
        (
            results("NVIDIA H100 80GB HBM3 (gpu)", [row("resnet18", 9_000, precision="float32")]),
            "this run has no row they are about (mixed_bfloat16",
        ),
    ],
    ids=["a CPU", "another GPU", "other shapes", "another precision"],
)
def test_a_run_that_judges_no_target_says_why(run, why):
    assert not gpu_targets.gpu_targets(run)
    text = gpu_targets.gpu_targets_markdown(run)
    assert len(text.splitlines()) == 1 and "none judged: " in text and why in text, text
