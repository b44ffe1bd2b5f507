"""What a run needs (dataset, model config, batches, schedule, strategy), computed and checked before it writes."""

import dataclasses

from keras_attnconv.training.distribution import make_strategy, process_shard, replica_count, uses_tf_data


@dataclasses.dataclass
class RunPlan:
    """What a run needs, computed and checked before anything is written."""

    dataset: object  # DatasetInfo
    model_config: object  # the model's config (a ClassifierConfig), validated once: the run builds from it
    preset_model: object  # the trained model a fine-tuning run starts from (`fine_tuning.start_from`), or None
    eval_split: str
    train_batches: object
    eval_batches: object
    steps_per_epoch: int
    schedule: object
    strategy: object
    replicas: int


def checked_model_config(config, info):
    """The model's config for `config` on a dataset (`DatasetInfo`), validated; loads no data."""
    return checked_start(config, info)[1]


def checked_start(config, info):
    """``(preset_model, model_config)``: what a run of `config` on a dataset (`DatasetInfo`) starts from.

    The preset's trained model for a fine-tuning run (`config.init_from`,
    `fine_tuning.starting_model`), None for new weights; and the run's model
    config, validated. Loads no data.
    """
    from keras_attnconv.models import get_model_card, get_model_config
    from keras_attnconv.training.data import pixel_statistics
    from keras_attnconv.training.fine_tuning import starting_model

    if config.init_from is None:  # a preset's model may be no registered one (a pruned model: `<name>_pruned`)
        get_model_card(config.model, argument="model")  # an unknown model named as the recipe and --model call it
    from_dataset = {"num_classes": info.num_classes, "image_size": info.image_size}
    for field, value in from_dataset.items():
        if field in config.model_overrides and config.model_overrides[field] != value:
            raise ValueError(
                f"`{field}` comes from the dataset ({value} for {config.dataset}) and cannot be "
                f"overridden. Received: model_overrides={config.model_overrides!r}"
            )
    if config.init_from is not None:
        return starting_model(config, info)
    mean, std = pixel_statistics(info, config.normalization)
    model_fields = {
        **from_dataset,
        "class_names": info.class_names,
        "pixel_mean": mean,
        "pixel_std": std,
        **config.model_overrides,
    }
    return None, get_model_config(config.model, **model_fields)


def plan_run(config):
    """Checks the dataset, model configuration, schedule and strategy of `config`; writes nothing."""
    from keras_attnconv.optim import run_schedule
    from keras_attnconv.training.data import dataset_info, load_arrays
    from keras_attnconv.training.fine_tuning import init_from_preset
    from keras_attnconv.training.input_pipeline import ArrayBatches

    info = dataset_info(config.dataset)
    if config.init_from is None:
        preset_model, model_config = checked_start(config, info)
    else:
        init_from_preset(config.init_from)  # no preset there: said before the data is read
    eval_split = config.eval_split or info.eval_split
    data_args = {"data_dir": config.data_dir, "download": config.download}
    train_arrays = load_arrays(config.dataset, "train", **data_args)
    eval_arrays = load_arrays(config.dataset, eval_split, **data_args, argument="eval_split")
    strategy = make_strategy(config.strategy)
    if config.init_from is not None:
        # Loading the preset builds a model, which starts TensorFlow's runtime: tf.distribute's multi-worker
        # strategy configures its collective ops before that or not at all ("at program startup").
        preset_model, model_config = checked_start(config, info)
    replicas = replica_count(strategy)
    if config.batch_size % replicas:
        raise ValueError(
            f"`batch_size` must divide evenly across the {replicas} replicas of the "
            f"{config.strategy!r} strategy. Received: batch_size={config.batch_size}"
        )
    if len(train_arrays[0]) < config.batch_size:  # the training steps take full batches only (static shapes)
        raise ValueError(
            f"The {len(train_arrays[0])} training images of {str(config.dataset)!r} are fewer than one batch: "
            f"choose a batch_size of at most {len(train_arrays[0])}. Received: batch_size={config.batch_size}"
        )
    if not uses_tf_data(strategy):
        check_last_batch(config, len(eval_arrays[0]), eval_split, replicas)
    shard = process_shard(strategy)
    train_batches = ArrayBatches(
        *train_arrays,
        augment=True,
        shuffle=True,
        seed=config.seed,
        drop_remainder=True,
        steps_per_epoch=config.steps_per_epoch,
        batch_size=config.batch_size,
        shard=shard,
        cutout=config.cutout,
        cutout_fill=mean_pixel(model_config.pixel_mean),
    )
    eval_batches = ArrayBatches(*eval_arrays, batch_size=config.batch_size, shard=shard)
    steps_per_epoch = len(train_batches)
    schedule = run_schedule(
        config.schedule,
        config.learning_rate,
        config.epochs,
        steps_per_epoch,
        config.warmup_ratio,
        config.min_warmup_epochs,
    )
    return RunPlan(
        info,
        model_config,
        preset_model,
        eval_split,
        train_batches,
        eval_batches,
        steps_per_epoch,
        schedule,
        strategy,
        replicas,
    )


def mean_pixel(pixel_mean):
    """The uint8 pixel a model normalises to about zero: its mean (per channel, of pixels / 255), rounded."""
    return tuple(round(255 * channel) for channel in pixel_mean)


def check_last_batch(config, images, split, replicas):
    """Checks that the last, partial batch of the evaluation split divides across the replicas too.

    Keras' distribution on JAX splits every batch evenly over the devices (tf.distribute pads a
    partial batch itself); padding it here would change the evaluation's mean loss.
    """
    last = images % config.batch_size
    if replicas > 1 and last % replicas:
        raise ValueError(
            f"The {images} images of the {split!r} split leave a last batch of {last}, which does not "
            f"divide across the {replicas} replicas of the {config.strategy!r} strategy: choose a "
            f"batch_size whose remainder does (or none). Received: batch_size={config.batch_size}"
        )


def check_run(config, *, models=()):
    """Checks everything `train` checks before it writes (dataset, model configuration, schedule, strategy).

    Each name of `models` is checked too, as `config` with that model: the
    data, schedule and strategy, which do not depend on the model, are loaded
    and checked once (a comparison trains several models on the same data).
    Returns the `RunPlan` of `config`.
    """
    plan = plan_run(config)
    for name in models:
        checked_model_config(dataclasses.replace(config, model=name), plan.dataset)
    return plan
