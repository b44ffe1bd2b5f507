"""CIFAR ResNets (He et al., 2015, 3x3 stem for 32x32 images): the paper's baselines."""

import dataclasses

import keras

from keras_attnconv.models.validation import check_config_fields


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    """A CIFAR ResNet with basic blocks.

    Attributes:
        blocks_per_stage: basic blocks in each of the stages (ResNet-18: 2, 2, 2, 2).
        widths: channels of each stage (64, 128, 256, 512).
        num_classes: classes of the classifier.
        image_size: side of the square input image.
    """

    blocks_per_stage: "tuple[int, ...]" = (2, 2, 2, 2)
    widths: "tuple[int, ...]" = (64, 128, 256, 512)
    num_classes: int = 10
    image_size: int = 32

    def __post_init__(self):
        for field in ("blocks_per_stage", "widths"):
            value = tuple(getattr(self, field))
            object.__setattr__(self, field, value)
            if not value or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
                raise ValueError(f"`{field}` must be a non-empty tuple of positive integers. "
                                 f"Received: {field}={value}")
        if len(self.blocks_per_stage) != len(self.widths):
            raise ValueError(f"`blocks_per_stage` and `widths` must have one entry per stage. "
                             f"Received: blocks_per_stage={self.blocks_per_stage}, widths={self.widths}")
        check_config_fields(self, positive=("image_size",))

    def build(self, name=None):
        return build_resnet(self, name=name)


def _conv_bn(x, filters, kernel_size, strides, name):
    x = keras.layers.Conv2D(filters, kernel_size, strides=strides, padding="same", use_bias=False,
                            kernel_initializer="he_normal", name=f"{name}_conv")(x)
    return keras.layers.BatchNormalization(name=f"{name}_bn")(x)


def _basic_block(x, filters, strides, name):
    shortcut = x
    y = keras.layers.ReLU(name=f"{name}_relu1")(_conv_bn(x, filters, 3, strides, f"{name}_1"))
    y = _conv_bn(y, filters, 3, 1, f"{name}_2")
    if strides != 1 or x.shape[-1] != filters:
        shortcut = _conv_bn(x, filters, 1, strides, f"{name}_shortcut")
    return keras.layers.ReLU(name=f"{name}_out")(keras.layers.Add(name=f"{name}_add")([y, shortcut]))


def build_resnet(config, name=None):
    """Builds the functional Keras ResNet described by `config` (logits output)."""
    inputs = keras.Input((config.image_size, config.image_size, 3), name="images")
    x = keras.layers.ReLU(name="stem_relu")(_conv_bn(inputs, config.widths[0], 3, 1, "stem"))
    for stage, (blocks, filters) in enumerate(zip(config.blocks_per_stage, config.widths)):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(x, filters, strides, f"stage{stage + 1}_block{block + 1}")
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(config.num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name=name or "resnet")
