"""The zoo's table: our parameter and FLOP counts beside the paper's figures.

Counting builds each model (31 of them, up to 29.5M parameters: tens of seconds), so the counts of the
registered configurations are recorded in `COUNTS_FILE` (package data), which `attnconv list` prints at
once; a test builds every model and holds the file to what it counts. A name the file lacks (a family
registered later) is counted when asked. ``python -m keras_attnconv.models.summary`` writes the file anew.
"""

import json
import math
from pathlib import Path

from keras_attnconv.models.flops import count_flops
from keras_attnconv.models.registry import build_model, get_paper_figures, list_models

#: The recorded counts of the registered configurations, by name: params, flops_linear, flops_total.
COUNTS_FILE = Path(__file__).with_name("zoo_counts.json")


def trainable_parameters(model):
    """Trainable parameters (what PyTorch's ``parameters()`` counts: no BatchNorm statistics)."""
    return sum(math.prod(w.shape) for w in model.trainable_weights)


def count_model(name):
    """``{"params", "flops_linear", "flops_total"}`` of the registered model `name`, counted on a built model."""
    model = build_model(name)
    flops = count_flops(model)
    return {"params": trainable_parameters(model), "flops_linear": flops.linear, "flops_total": flops.total}


def recorded_counts():
    """The counts of `COUNTS_FILE`, by name ({} where it is absent)."""
    return json.loads(COUNTS_FILE.read_text()) if COUNTS_FILE.exists() else {}


def model_rows(names=None, recount=False):
    """One dict per model: name, paper row, our/paper parameters, our/paper FLOPs.

    The counts are the recorded ones (`COUNTS_FILE`) where it has the name, unless `recount`; else counted.
    """
    recorded = {} if recount else recorded_counts()
    rows = []
    for name in names or list_models():
        paper = get_paper_figures(name)  # an unknown name fails here, with the closest ones
        counts = recorded.get(name) or count_model(name)
        rows.append(
            {
                "name": name,
                "paper_row": f"{paper.row} ({paper.source})",
                "params": counts["params"],
                "paper_params_millions": paper.params_millions,
                "flops_linear": counts["flops_linear"],
                "flops_total": counts["flops_total"],
                "paper_flops_billions": paper.flops_billions,
            }
        )
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


if __name__ == "__main__":  # writes COUNTS_FILE anew from the registered models
    COUNTS_FILE.write_text(json.dumps({name: count_model(name) for name in list_models()}, indent=1) + "\n")
