"""What the zoo knows of one registered name: its config, the paper's figures, and what it trained to here.

One typed record per name (timm's ``PretrainedCfg``, keras-hub's preset
metadata): a family's ``configurations.py`` writes each one out and
`register_model` collects it.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class PaperFigures:
    """What the paper (or the work a configuration comes from) reports for it; None where it reports nothing.

    Attributes:
        row: the row or model the figures are from, in the source's words.
        params_millions: trainable parameters, in millions.
        flops_billions: forward FLOPs per image, in billions.
        source: where the figures are (``"Table 1"``, ``"Appendix F"``, ``"ours"`` for the small variants).
        accuracy: CIFAR-10 test accuracy after the paper's 300 epochs (Tables 1 and 4).
    """

    row: str
    params_millions: "float | None" = None
    flops_billions: "float | None" = None
    source: str = "Table 1"
    accuracy: "float | None" = None


#: The data of the GPU runs (`TrainedResult.data`): a public JPEG copy of CIFAR-10, not bit-identical to it.
CIFAR10_JPEG_COPY = "CIFAR-10 (JPEG copy)"
#: A `TrainedResult`'s data and results file for a run of Table 1 on an H200 (``attnconv table1``).
TABLE1_H200 = {"data": CIFAR10_JPEG_COPY, "results_file": "training/results/table1-h200.json"}


@dataclasses.dataclass(frozen=True)
class TrainedResult:
    """One training run of a configuration on the paper's data, as a results file of the repository records it.

    Attributes:
        recipe: the recipe that trained it (``attnconv train --recipe <recipe>``).
        accuracy: test accuracy of its last epoch's weights.
        standard_error: the accuracy's binomial standard error.
        epochs: epochs trained.
        minutes: minutes of training (fit and evaluations, compilation included).
        device: what it trained on.
        data: the data's name (``"CIFAR-10 (JPEG copy)"``).
        results_file: the results file, relative to the repository (``training/results/...``).
        beside: the recipes trained at the same time on the same device, whose
            work `minutes` includes (a run alone is faster); empty where none.
    """

    recipe: str
    accuracy: float
    standard_error: float
    epochs: int
    minutes: float
    device: str
    data: str
    results_file: str
    beside: "tuple[str, ...]" = ()


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """A registered configuration: its name, its family's validated config, and its figures.

    Attributes:
        name: the registered name (`build_model`'s argument, the model's identity).
        config: the family's config (a `ClassifierConfig`), validated when it was made.
        paper: the paper's figures (`PaperFigures`).
        trained: this package's trained results (`TrainedResult`), most recent last; empty where none.
    """

    name: str
    config: object
    paper: PaperFigures
    trained: "tuple[TrainedResult, ...]" = ()

    @property
    def family(self):
        """The name of the model class the config builds (``"AttentionClassifier"``, ``"ResNet"``)."""
        return type(self.config).model_class.__name__
