"""The zoo's table: our parameter and FLOP counts beside the paper's figures."""

import math

from keras_attnconv.models.flops import count_flops
from keras_attnconv.models.registry import build_model, get_paper_figures, list_models


def trainable_parameters(model):
    """Trainable parameters (what PyTorch's ``parameters()`` counts: no BatchNorm statistics)."""
    return sum(math.prod(w.shape) for w in model.trainable_weights)


def model_rows(names=None):
    """One dict per model: name, paper row, our/paper parameters, our/paper FLOPs."""
    rows = []
    for name in names or list_models():
        model = build_model(name)
        paper = get_paper_figures(name)
        flops = count_flops(model)
        rows.append({
            "name": name,
            "paper_row": f"{paper.row} ({paper.source})",
            "params": trainable_parameters(model),
            "paper_params_millions": paper.params_millions,
            "flops_linear": flops.linear,
            "flops_total": flops.total,
            "paper_flops_billions": paper.flops_billions,
        })
    return rows


def _fmt(value, scale, suffix):
    return "-" if value is None else f"{value / scale:.2f}{suffix}" if scale else f"{value:g}{suffix}"


def markdown_table(rows):
    """Rows of `model_rows` as a markdown table."""
    lines = [
        "| model | paper row | params (ours) | params (paper) | FLOPs, weights (ours) | FLOPs (paper) "
        "| FLOPs, with attention (ours) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| `{row['name']}` | {row['paper_row']} | {_fmt(row['params'], 1e6, 'M')} "
            f"| {_fmt(row['paper_params_millions'], None, 'M')} | {_fmt(row['flops_linear'], 1e9, 'B')} "
            f"| {_fmt(row['paper_flops_billions'], None, 'B')} | {_fmt(row['flops_total'], 1e9, 'B')} |"
        )
    return "\n".join(lines)
