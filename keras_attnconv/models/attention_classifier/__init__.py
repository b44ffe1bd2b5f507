"""The paper's attention classifier family: its config, the model, and the named configurations of its encodings."""

from keras_attnconv.models.attention_classifier import configurations  # noqa: F401  (registers the family's names)
from keras_attnconv.models.attention_classifier.config import AttentionClassifierConfig
from keras_attnconv.models.attention_classifier.model import AttentionClassifier, with_attention_options

__all__ = ["AttentionClassifier", "AttentionClassifierConfig", "with_attention_options"]
