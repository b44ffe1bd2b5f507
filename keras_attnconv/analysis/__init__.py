"""What a trained model does, and changes to it: where its heads attend, a convolution as attention, pruning of
degenerate heads, images per second, and figures (`keras_attnconv.analysis.viz`, matplotlib loaded on first use)."""

from keras_attnconv.analysis.attention import (
    AttentionCentersHistory,
    attention_probabilities,
    layer_centers,
    load_centers_history,
)
from keras_attnconv.analysis.conversion import ConversionMeasurement, conv_to_attention, measure_conversion
from keras_attnconv.analysis.pruning import (
    LayerPruning,
    compile_for_fine_tuning,
    degenerate_heads,
    prune_degenerate_heads,
)
from keras_attnconv.analysis.throughput import Throughput

__all__ = [
    "AttentionCentersHistory",
    "ConversionMeasurement",
    "LayerPruning",
    "Throughput",
    "attention_probabilities",
    "compile_for_fine_tuning",
    "conv_to_attention",
    "degenerate_heads",
    "layer_centers",
    "load_centers_history",
    "measure_conversion",
    "prune_degenerate_heads",
]
