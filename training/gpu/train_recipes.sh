#!/usr/bin/env bash
# On a lent GPU machine (JAX, no TensorFlow), once cifar10_parts.py has written /tmp/cifar10.npz: trains each
# recipe on the full CIFAR-10 (JPEG copy), all within LIMIT_S seconds, draws its figures, and packs its records
# into $OUT as it ends. The weights (checkpoints, resumable backup, preset) stay on the machine: what comes back is
# at most 16 MiB a file, and `attnconv table1` and `attnconv choices` read the records (config, history, metrics,
# epoch times, centers). A run the limit stops keeps its finished epochs' records.
#
#   training/gpu/train_recipes.sh [--side-by-side] LIMIT_S RUN [RUN ...]
#
# RUN: a recipe's name, or a recipe with the settings it changes as one argument ("quadratic_fast --cutout 16"),
# trained in runs/<recipe> or runs/<recipe>-<changes> (runs/quadratic_fast-cutout-16). --side-by-side: all at
# once, each for the whole limit (`attnconv table1 --side-by-side` then says their minutes are shared); else in
# turn, each for what the runs before it left.
set -u
side_by_side=false
if [ "${1:-}" = "--side-by-side" ]; then
    side_by_side=true
    shift
fi
limit=$1
shift
start=$SECONDS

run_name() {  # "quadratic_fast --cutout 16" -> quadratic_fast-cutout-16
    local words
    read -r -a words <<<"$1"
    local name="${words[*]}"
    name="${name// --/-}"
    echo "${name// /-}"
}

train() {  # RUN SECONDS: trains RUN for at most SECONDS, then draws and packs its records
    local words name
    read -r -a words <<<"$1"
    name=$(run_name "$1")
    echo "== $name: training, at most $2 s"
    timeout --signal=TERM --kill-after=10 "$2" \
        python3 -m keras_attnconv.cli train --recipe "${words[0]}" "${words[@]:1}" --dataset /tmp/cifar10.npz \
        --run-dir "runs/$name" --verbose 2
    echo "== $name: exit $?"
    python3 -m keras_attnconv.cli plot "runs/$name" || echo "== $name: no figures"
    tar czf "$OUT/$name.tgz" --exclude=backup --exclude=checkpoints --exclude=preset -C runs "$name"
}

if $side_by_side; then
    for run in "$@"; do
        train "$run" $((limit - 30)) >"$OUT/$(run_name "$run").log" 2>&1 &  # 30 s kept to draw and pack
    done
    wait
    tail -n 5 "$OUT"/*.log
    exit 0
fi
for run in "$@"; do
    left=$((limit - (SECONDS - start) - 30))  # 30 s kept to draw and pack
    if [ "$left" -lt 60 ]; then
        echo "== $(run_name "$run"): not started, $left s left"
        break
    fi
    train "$run" "$left"
done
