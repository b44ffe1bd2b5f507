"""The ResNet family: `ResNetConfig`, the `ResNet` model and its named configurations (registered on import)."""

from keras_attnconv.models.resnet import configurations  # noqa: F401  (registers the family's names)
from keras_attnconv.models.resnet.config import ResNetConfig
from keras_attnconv.models.resnet.model import ResNet

__all__ = ["ResNet", "ResNetConfig"]
