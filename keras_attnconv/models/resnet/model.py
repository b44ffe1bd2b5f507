"""CIFAR ResNets (He et al., 2015, 3x3 stem for 32x32 images), the paper's baselines, built from a `ResNetConfig`."""

import keras

from keras_attnconv.models.image_classifier import ImageClassifier
from keras_attnconv.models.resnet.config import ResNetConfig


def _conv_bn(x, filters, kernel_size, strides, name, dtype):
    x = keras.layers.Conv2D(
        filters,
        kernel_size,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer="he_normal",
        dtype=dtype,
        name=f"{name}_conv",
    )(x)
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
