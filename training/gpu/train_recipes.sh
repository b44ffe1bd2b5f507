#!/usr/bin/env bash
# On a lent GPU machine (JAX, no TensorFlow), once cifar10_parts.py has written /tmp/cifar10.npz: trains each
# recipe on the full CIFAR-10 (JPEG copy) in turn, all within LIMIT_S seconds, draws its figures, and packs its
# records into $OUT as it ends. The weights (checkpoints, resumable backup, preset) stay on the machine: what
# comes back is at most 16 MiB a file, and `attnconv table1` reads the records (config, history, metrics,
# epoch times, centers). A run the limit stops keeps its finished epochs' records.
#
#   training/gpu/train_recipes.sh LIMIT_S RECIPE [RECIPE ...]
set -u
limit=$1
shift
start=$SECONDS
for recipe in "$@"; do
    left=$((limit - (SECONDS - start) - 30))  # 30 s kept to draw and pack
    if [ "$left" -lt 60 ]; then
        echo "== $recipe: not started, $left s left"
        break
    fi
    echo "== $recipe: training, at most $left s"
    timeout --signal=TERM --kill-after=10 "$left" \
        python3 -m keras_attnconv.cli train --recipe "$recipe" --dataset /tmp/cifar10.npz --run-dir "runs/$recipe" --verbose 2
    echo "== $recipe: exit $?"
    python3 -m keras_attnconv.cli plot "runs/$recipe" || echo "== $recipe: no figures"
    tar czf "$OUT/$recipe.tgz" --exclude=backup --exclude=checkpoints --exclude=preset -C runs "$recipe"
done
