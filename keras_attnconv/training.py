"""The training pipeline behind `attnconv train`: recipe -> run directory -> trained model + metrics.

A run directory holds ``config.json`` (the resolved recipe), ``backup/``
(resumable state, see `ResumableBackup`), ``checkpoints/best.keras``,
``logs/`` (TensorBoard), ``history.csv`` and, once finished, ``metrics.json``;
the best checkpoint is then exported for TF Serving under ``export_dir``.
Running the same command again after a crash resumes the run; running it after
the run finished starts a new directory (``<name>-1``, ``<name>-2``, ...).
"""

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import keras

from keras_attnconv.callbacks import BestCheckpoint, ResumableBackup, Throughput, write_json
from keras_attnconv.layers.validation import closest_names

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("default", "mirrored", "multi_worker")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training run; the defaults are Table 2 of the paper.

    Every field can be set in a recipe TOML file and on the command line
    (``--epochs 3``, ``--precision mixed_bfloat16``, ``--model-overrides
    '{"num_layers": 2}'``).
    """

    name: str = "run"
    model: str = "quadratic"
    model_overrides: dict = dataclasses.field(default_factory=dict)
    dataset: str = "cifar10"
    data_dir: "str | None" = None
    download: bool = False
    eval_split: "str | None" = None
    epochs: int = 300
    batch_size: int = 100
    learning_rate: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    warmup_ratio: float = 0.05
    precision: str = "float32"
    jit_compile: bool = True
    strategy: str = "default"
    seed: "int | None" = 0
    steps_per_epoch: "int | None" = None
    runs_dir: str = "runs"
    run_dir: "str | None" = None
    export_dir: "str | None" = "saved_models"
    verbose: int = 1

    def __post_init__(self):
        for field in ("epochs", "batch_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{field}` must be a positive integer. Received: {field}={value!r}")
        if self.steps_per_epoch is not None and (not isinstance(self.steps_per_epoch, int) or self.steps_per_epoch < 1):
            raise ValueError(f"`steps_per_epoch` must be None or a positive integer. "
                             f"Received: steps_per_epoch={self.steps_per_epoch!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"`precision` must be one of {PRECISIONS}. Received: precision={self.precision!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"`strategy` must be one of {STRATEGIES}. Received: strategy={self.strategy!r}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"`warmup_ratio` must be in [0, 1). Received: warmup_ratio={self.warmup_ratio}")
        if not isinstance(self.model_overrides, dict):
            raise ValueError(
                f"`model_overrides` must be a table/dict. Received: model_overrides={self.model_overrides!r}"
            )

    @classmethod
    def from_dict(cls, values, source="recipe"):
        """Builds a config, rejecting unknown fields by name (with the closest valid one)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            if key not in fields:
                suggestions = closest_names(key, fields)
                hint = f" Did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
                raise ValueError(f"Unknown {source} field {key!r}.{hint} Received: {key}={values[key]!r}")
        return cls(**values)


def toml_module():
    """`tomllib` (Python 3.11+) or its backport `tomli` (Python 3.10)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib


def load_recipe(path, **overrides):
    """A `TrainConfig` from a recipe TOML file, with `overrides` applied (None values ignored)."""
    tomllib = toml_module()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No recipe at {str(path)!r}. Received: recipe={str(path)!r}")
    with path.open("rb") as f:
        values = {"name": path.stem, **tomllib.load(f)}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig.from_dict(values, source=f"recipe ({path})")


def make_strategy(name):
    """The tf.distribute strategy: one device, all local GPUs (or CPUs), or all workers of TF_CONFIG."""
    import tensorflow as tf

    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def resolve_run_dir(config):
    """The run directory: the configured one, or ``runs_dir/name`` (numbered anew once finished)."""
    if config.run_dir:
        return Path(config.run_dir)
    base = Path(config.runs_dir) / config.name
    candidate, index = base, 0
    while (candidate / "metrics.json").exists():
        index += 1
        candidate = base.with_name(f"{base.name}-{index}")
    return candidate


def _check_same_run(run_dir, resolved):
    saved_path = run_dir / "config.json"
    if not saved_path.exists():
        return
    saved = json.loads(saved_path.read_text())
    changed = sorted(k for k in set(saved) | set(resolved)
                     if k not in ("verbose", "run_dir") and saved.get(k) != resolved.get(k))
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {resolved.get(k)!r}" for k in changed)
        raise ValueError(f"{run_dir} holds an unfinished run with a different configuration ({details}). "
                         "Resume it with the same settings, or pass another --run-dir.")


def _centre_tracking(model, run_dir):
    """Records the heads' centres each epoch (``centers_history.npz``) for Gaussian-type models."""
    from keras_attnconv.viz import AttentionCentersHistory, layer_centers

    try:
        layer_centers(model)
    except ValueError:  # no quadratic/gaussian attention in this model
        return []
    return [AttentionCentersHistory(run_dir / "centers_history.npz")]


def train(config):
    """Trains `config` (a `TrainConfig`) and returns the final metrics dict.

    The global dtype policy is set for the run and restored afterwards.
    """
    from keras_attnconv.data import dataset_info, load_dataset
    from keras_attnconv.models import build_model
    from keras_attnconv.models.summary import trainable_parameters
    from keras_attnconv.optim import CoupledWeightDecaySGD, WarmupCosineDecay

    run_dir = resolve_run_dir(config)
    resolved = {**dataclasses.asdict(config), "run_dir": str(run_dir)}
    _check_same_run(run_dir, resolved)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "config.json", resolved)

    strategy = make_strategy(config.strategy)
    replicas = strategy.num_replicas_in_sync
    if config.batch_size % replicas:
        raise ValueError(f"`batch_size` must divide evenly across the {replicas} replicas of the "
                         f"{config.strategy!r} strategy. Received: batch_size={config.batch_size}")
    info = dataset_info(config.dataset)
    eval_split = config.eval_split or info.eval_split
    data_args = {"batch_size": config.batch_size, "data_dir": config.data_dir, "download": config.download}
    train_data = load_dataset(config.dataset, "train", seed=config.seed, **data_args)
    eval_data = load_dataset(config.dataset, eval_split, **data_args)
    steps_per_epoch = config.steps_per_epoch or int(train_data.cardinality())
    if steps_per_epoch < 1:
        raise ValueError(f"The training split of {config.dataset!r} has fewer images than one batch of "
                         f"{config.batch_size}. Received: batch_size={config.batch_size}")
    if config.steps_per_epoch:
        train_data = train_data.repeat()
    total_steps = steps_per_epoch * config.epochs

    previous_policy = keras.config.dtype_policy()
    keras.mixed_precision.set_dtype_policy(config.precision)
    try:
        with strategy.scope():
            model_args = {"num_classes": info.num_classes, "image_size": info.image_size, **config.model_overrides}
            model = build_model(config.model, seed=config.seed, **model_args)
            schedule = WarmupCosineDecay(config.learning_rate, total_steps,
                                         warmup_steps=math.floor(config.warmup_ratio * total_steps))
            model.compile(
                optimizer=CoupledWeightDecaySGD(schedule, momentum=config.momentum,
                                                weight_decay=config.weight_decay),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
                jit_compile=config.jit_compile,
            )
            backup = ResumableBackup(run_dir / "backup")
            initial_epoch = backup.restore(model)
        if initial_epoch:
            print(f"Resuming {run_dir} from epoch {initial_epoch}/{config.epochs}", file=sys.stderr)
        throughput = Throughput(steps_per_epoch * config.batch_size)
        start = time.perf_counter()
        history = model.fit(
            train_data,
            validation_data=eval_data,
            epochs=config.epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch,
            verbose=config.verbose,
            shuffle=False,  # the dataset shuffles itself
            callbacks=[
                backup,
                BestCheckpoint(run_dir / "checkpoints" / "best.keras"),
                keras.callbacks.CSVLogger(str(run_dir / "history.csv"), append=True),
                keras.callbacks.TensorBoard(str(run_dir / "logs"), profile_batch=0),
                throughput,
                *_centre_tracking(model, run_dir),
            ],
        )
        loss, accuracy = model.evaluate(eval_data, verbose=0)
        best_path = run_dir / "checkpoints" / "best.json"
        metrics = {
            "model": config.model,
            "dataset": config.dataset,
            "eval_split": eval_split,
            "eval_loss": float(loss),
            "eval_accuracy": float(accuracy),
            "best_val_accuracy": json.loads(best_path.read_text())["val_accuracy"] if best_path.exists() else None,
            "epochs": config.epochs,
            "optimizer_steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
            "trainable_parameters": trainable_parameters(model),
            "train_images_per_second": throughput.images_per_second,
            "precision": config.precision,
            "jit_compile": config.jit_compile,
            "replicas": replicas,
            "wall_seconds_this_session": time.perf_counter() - start,
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        }
        write_json(run_dir / "metrics.json", metrics)
        metrics["run_dir"] = str(run_dir)
    finally:
        keras.mixed_precision.set_dtype_policy(previous_policy)
    if config.export_dir:
        from keras_attnconv.export import export_registered

        metrics["export"] = str(export_registered(config.model, config.export_dir, run_dir=run_dir))
    return metrics
