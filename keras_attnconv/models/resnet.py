"""CIFAR ResNets (He et al., 2015, 3x3 stem for 32x32 images), the paper's baselines: `ResNetConfig`, `ResNet`."""

import dataclasses

import keras

from keras_attnconv.models.image_classifier import ClassifierConfig, ImageClassifier
from keras_attnconv.models.validation import check_sizes


@dataclasses.dataclass(frozen=True)
class ResNetConfig(ClassifierConfig):
    """A CIFAR ResNet with basic blocks, after the fields of `ClassifierConfig`.

    Attributes:
        blocks_per_stage: basic blocks in each of the stages (ResNet-18: 2, 2, 2, 2).
        widths: channels of each stage (64, 128, 256, 512).
    """

    blocks_per_stage: "tuple[int, ...]" = (2, 2, 2, 2)
    widths: "tuple[int, ...]" = (64, 128, 256, 512)

    def __post_init__(self):
        super().__post_init__()
        for field in ("blocks_per_stage", "widths"):
            value = tuple(getattr(self, field))
            self._set(field, value)
            if not value or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
                raise ValueError(f"`{field}` must be a non-empty tuple of positive integers. "
                                 f"Received: {field}={value}")
        if len(self.blocks_per_stage) != len(self.widths):
            raise ValueError(f"`blocks_per_stage` and `widths` must have one entry per stage. "
                             f"Received: blocks_per_stage={self.blocks_per_stage}, widths={self.widths}")
        check_sizes(self, self.largest_tensors())

    def largest_tensors(self):
        """``(what, fields, elements)`` of the largest tensors of the model (see `check_sizes`)."""
        widths, sides = self.widths, [-(-self.image_size // 2**stage) for stage in range(len(self.widths))]
        kernels = [9 * w_out * max(w_in, w_out) for w_in, w_out in zip((widths[0], *widths), widths)]  # a stage's
        return [("A convolution kernel", ("widths",), max(kernels)),
                ("The logits kernel", ("num_classes", "widths"), widths[-1] * self.num_classes),
                ("One image's feature maps", ("image_size", "widths"), max(w * s * s for w, s in zip(widths, sides))),
                ("The weights", ("blocks_per_stage", "widths", "num_classes"),
                 sum(2 * b * k for b, k in zip(self.blocks_per_stage, kernels)) + widths[-1] * self.num_classes)]

    def build(self, name=None, dtype=None):
        """The `ResNet` of this config, every layer in the dtype policy `dtype`."""
        return ResNet(**dataclasses.asdict(self), name=name, dtype=dtype)


def _conv_bn(x, filters, kernel_size, strides, name, dtype):
    x = keras.layers.Conv2D(filters, kernel_size, strides=strides, padding="same", use_bias=False,
                            kernel_initializer="he_normal", dtype=dtype, name=f"{name}_conv")(x)
    return keras.layers.BatchNormalization(dtype=dtype, name=f"{name}_bn")(x)


def _basic_block(x, filters, strides, name, dtype):
    shortcut = x
    y = keras.layers.ReLU(dtype=dtype, name=f"{name}_relu1")(_conv_bn(x, filters, 3, strides, f"{name}_1", dtype))
    y = _conv_bn(y, filters, 3, 1, f"{name}_2", dtype)
    if strides != 1 or x.shape[-1] != filters:
        shortcut = _conv_bn(x, filters, 1, strides, f"{name}_shortcut", dtype)
    added = keras.layers.Add(dtype=dtype, name=f"{name}_add")([y, shortcut])
    return keras.layers.ReLU(dtype=dtype, name=f"{name}_out")(added)


@keras.saving.register_keras_serializable(package="keras_attnconv")
class ResNet(ImageClassifier):
    """A CIFAR ResNet classifier; its constructor arguments are the fields of `ResNetConfig` (see `ImageClassifier`)."""

    config_class = ResNetConfig
    default_name = "resnet"

    @staticmethod
    def features(x, config, dtype):
        x = keras.layers.ReLU(dtype=dtype, name="stem_relu")(_conv_bn(x, config.widths[0], 3, 1, "stem", dtype))
        for stage, (blocks, filters) in enumerate(zip(config.blocks_per_stage, config.widths)):
            for block in range(blocks):
                strides = 2 if stage > 0 and block == 0 else 1
                x = _basic_block(x, filters, strides, f"stage{stage + 1}_block{block + 1}", dtype)
        return x
