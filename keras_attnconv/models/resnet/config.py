"""`ResNetConfig`: a CIFAR ResNet's stages, validated once, when made."""

import dataclasses

from keras_attnconv.models.image_classifier import ClassifierConfig
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
                raise ValueError(f"`{field}` must be a non-empty tuple of positive integers. Received: {field}={value}")
        if len(self.blocks_per_stage) != len(self.widths):
            raise ValueError(
                f"`blocks_per_stage` and `widths` must have one entry per stage. "
                f"Received: blocks_per_stage={self.blocks_per_stage}, widths={self.widths}"
            )
        check_sizes(self, self.largest_tensors())

    def largest_tensors(self):
        """``(what, fields, elements)`` of the largest tensors of the model (see `check_sizes`)."""
        widths, sides = self.widths, [-(-self.image_size // 2**stage) for stage in range(len(self.widths))]
        kernels = [9 * w_out * max(w_in, w_out) for w_in, w_out in zip((widths[0], *widths), widths)]  # a stage's
        return [
            ("A convolution kernel", ("widths",), max(kernels)),
            ("The logits kernel", ("num_classes", "widths"), widths[-1] * self.num_classes),
            ("One image's feature maps", ("image_size", "widths"), max(w * s * s for w, s in zip(widths, sides))),
            (
                "The weights",
                ("blocks_per_stage", "widths", "num_classes"),
                sum(2 * b * k for b, k in zip(self.blocks_per_stage, kernels)) + widths[-1] * self.num_classes,
            ),
        ]
