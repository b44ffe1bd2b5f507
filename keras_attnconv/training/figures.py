"""`attnconv plot`: the figures of a training run or a preset, written into it (or beside it)."""

from keras_attnconv.analysis.attention import layer_centers, load_centers_history
from keras_attnconv.analysis.viz import plot_attention_centers, plot_attention_maps, plot_centers_history
from keras_attnconv.layers.encoder import encoder_blocks


def run_figures(source):
    """The figures of a training run directory or a preset, ``{name: Figure}``, from its (best) model.

    ``attention_centers`` for quadratic/Gaussian models, ``centers_history``
    where a run recorded one, and ``attention_maps`` of the first evaluation
    image of the model's dataset (a run's, as its preset records it; the
    embedded CIFAR-10 sample for a preset that names none) for the central
    query pixel, unless the dataset would need a download (cifar10/cifar100
    through tensorflow-datasets) or has another image size. A model with none
    of these (a ResNet) is a ValueError saying so.
    """
    from keras_attnconv.training.data import TFDS_DATASETS, dataset_info, load_arrays
    from keras_attnconv.models import AttentionClassifier
    from keras_attnconv.models.presets import from_preset, load_preset_metadata
    from keras_attnconv.training.run_directory import RunDirectory, preset_of

    preset = preset_of(source)
    model = from_preset(preset)
    figures = {}
    try:
        layer_centers(model)
        figures["attention_centers"] = plot_attention_centers(model)
    except ValueError:  # no centers: learned or content encodings
        pass
    dataset = load_preset_metadata(preset).get("dataset", "cifar10_sample")
    if isinstance(model, AttentionClassifier) and dataset not in TFDS_DATASETS:
        images, _ = load_arrays(dataset, dataset_info(dataset).eval_split)
        if images.shape[1:] == tuple(model.input_shape[1:]):
            height, width = encoder_blocks(model)[0].input.shape[1:3]
            figures["attention_maps"] = plot_attention_maps(model, images[0], (height // 2, width // 2))
    history = load_centers_history(RunDirectory(source).centers_history)
    if history:
        figures["centers_history"] = plot_centers_history(history)
    if not figures:
        reason = (f"its heads have no centers and no image of its dataset {dataset!r} is on this machine"
                  if isinstance(model, AttentionClassifier) else "it has no attention heads")
        raise ValueError(f"Nothing to draw for {source}: its model {model.name} ({type(model).__name__}) has no "
                         f"attention figure: {reason}. Received: source={str(source)!r}")
    return figures
