"""The ResNet family's named configurations (the paper's baselines), each with its figures, registered by name."""

from keras_attnconv.models.model_card import TABLE1_H200, PaperFigures, TrainedResult
from keras_attnconv.models.registry import register_model
from keras_attnconv.models.resnet.config import ResNetConfig

register_model(
    "resnet18",
    ResNetConfig(),
    PaperFigures("ResNet18", 11.2, 1.1, accuracy=0.938),
    trained=(
        TrainedResult(
            "resnet18_fast",
            accuracy=0.9080,
            standard_error=0.0029,
            epochs=60,
            minutes=4.5,
            device="NVIDIA H200 (gpu)",
            **TABLE1_H200,
            beside=("learned_fast",),
        ),
    ),
)
register_model(
    "resnet10", ResNetConfig(blocks_per_stage=(1, 1, 1, 1)), PaperFigures("ResNet10", 4.9, source="draft, Table 1")
)
# Small enough to train in minutes on 2 CPU cores.
register_model(
    "resnet_tiny",
    ResNetConfig(blocks_per_stage=(1, 1, 1), widths=(16, 32, 64)),
    PaperFigures("(small CPU variant of ResNet)", source="ours"),
)
