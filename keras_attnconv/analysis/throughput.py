"""`Throughput`: the images per second of ``model.fit``, as training reports them and the benchmarks measure them."""

import json
import statistics
import time
from pathlib import Path

import keras

from keras_attnconv.utils.files import write_json


class Throughput(keras.callbacks.Callback):
    """Measures training images per second from the seconds of every epoch of the run.

    With a `record`, the seconds of each epoch are written there at its end
    (``{"epoch_seconds": [...]}``, atomically), and a resumed run reads those of
    the epochs before `initial_epoch` (a later one is redone): a run resumed
    after its last epoch (killed before ``metrics.json``) still has its figure.

    Args:
        images_per_epoch: int, training images per epoch.
        record: None or the path of the record.
        initial_epoch: int, the epoch a resumed run starts at.
    """

    def __init__(self, images_per_epoch, record=None, initial_epoch=0):
        super().__init__()
        self.images_per_epoch = images_per_epoch
        self.record = record and Path(record)
        self.epoch_seconds = self._recorded()[:initial_epoch]

    def _recorded(self):
        if self.record is None or not self.record.exists():
            return []
        try:
            return list(json.loads(self.record.read_text())["epoch_seconds"])
        except (OSError, ValueError, KeyError, TypeError):  # damaged: a figure, not the training state
            return []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_seconds.append(time.perf_counter() - self._start)
        if self.record is not None:
            write_json(self.record, {"epoch_seconds": self.epoch_seconds})

    @property
    def images_per_second(self):
        """Median over the run's epochs after its first (compilation), when there are any; None without epochs."""
        seconds = self.epoch_seconds[1:] or self.epoch_seconds
        return self.images_per_epoch / statistics.median(seconds) if seconds else None
