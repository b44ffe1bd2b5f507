"""The targets the quadratic model's CPU training step is held to, checked on one run of the steps table.

Each is a ratio within one run (docs/performance.md, "The training step's
path"), on the path `jit_compile="auto"` takes (the rows' ``rule``):

- float32: the step's GFLOP/s at least 75% of the run's best float32 matmul rate;
- mixed_bfloat16, where the CPU has AMX: at least 50% of the run's best
  bfloat16 matmul rate; where it has AVX-512 BF16 without AMX: at least 2x
  the float32 step's speed. A CPU without bfloat16 units converts bfloat16
  to float32, so it has no bfloat16 target.
"""

from keras_attnconv.bench.measure import path_label

MODEL = "quadratic"
FLOAT32_FRACTION = 0.75
AMX_FRACTION = 0.5
AVX512_BF16_SPEEDUP = 2.0


def _rule_row(rows, precision):
    return next((row for row in rows if row["model"] == MODEL and row["precision"] == precision and row["rule"]), None)


def _fraction_target(row, least, what):
    measured = row["fraction_of_matmul"]
    return {
        "target": f"`{MODEL}` {row['precision']} ({path_label(row)}) at >= {100 * least:.0f}% of the {what} "
        "matmul rate",
        "measured": f"{100 * measured:.0f}%",
        "met": measured >= least,
        "shortfall": f"{100 * (least - measured):.0f} points" if measured < least else None,
    }


def step_targets(rows, bfloat16_units):
    """The targets (module docstring) that `rows` (`model_step_benchmark`) measure on a CPU with
    `bfloat16_units` (`cpu_capabilities`): dicts of ``target``, ``measured``, ``met`` and ``shortfall``
    (None where met). A target whose row the run left out (another model, one precision) is not listed."""
    float32, bfloat16 = _rule_row(rows, "float32"), _rule_row(rows, "mixed_bfloat16")
    targets = []
    if float32 is not None:
        targets.append(_fraction_target(float32, FLOAT32_FRACTION, "best float32"))
    if bfloat16 is not None and bfloat16_units == "AMX":
        targets.append(_fraction_target(bfloat16, AMX_FRACTION, "best bfloat16"))
    elif bfloat16 is not None and bfloat16_units is not None and float32 is not None:
        speedup = float32["step_ms"] / bfloat16["step_ms"]
        targets.append(
            {
                "target": f"`{MODEL}` mixed_bfloat16 ({path_label(bfloat16)}) at >= {AVX512_BF16_SPEEDUP:g}x "
                f"the float32 step's speed ({bfloat16_units})",
                "measured": f"{speedup:.2f}x",
                "met": speedup >= AVX512_BF16_SPEEDUP,
                "shortfall": None if speedup >= AVX512_BF16_SPEEDUP else f"{AVX512_BF16_SPEEDUP / speedup:.2f}x",
            }
        )
    return targets


def target_line(target):
    """A judged target (``target``, ``measured``, ``met``, ``shortfall``) as a line of a results table's list;
    the GPU step's targets (`gpu_targets`) are written the same way."""
    return f"- {target['target']}: {target['measured']}, " + (
        "met" if target["met"] else f"missed by {target['shortfall']}"
    )


def targets_markdown(rows, bfloat16_units):
    """`step_targets` as lines of text, with a line for a CPU that has no bfloat16 target; "" where none applies."""
    lines = [target_line(target) for target in step_targets(rows, bfloat16_units)]
    if bfloat16_units is None and _rule_row(rows, "mixed_bfloat16") is not None:
        lines.append(f"- `{MODEL}` mixed_bfloat16: no target on a CPU without bfloat16 units (AMX, AVX-512 BF16)")
    return "\n".join(["Targets (keras_attnconv/bench/step_targets.py):", *lines]) if lines else ""
