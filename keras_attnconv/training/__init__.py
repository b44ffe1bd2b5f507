"""The application that `attnconv train` runs: recipe -> run directory -> trained model, metrics and preset.

- `recipe`: a paper configuration (`TrainConfig`), by name from the package's
  recipes or from a TOML file; `data` and `input_pipeline`: the images;
- `run_directory`: the run's one owner (its layout, mark, lock and states);
  `runs`: which run directory a configuration trains in;
- `plan`: everything a run needs, checked before it writes; `distribution`:
  where it computes (tf.distribute, or Keras' distribution API on JAX);
  `fit`: the training itself (`train`); `callbacks`: the records that
  survive a crash;
- `workflow`: train, then export for serving; `comparison`, `numerics` and
  `figures`: several runs compared, precisions compared, a run's plots.
"""

from keras_attnconv.training.fit import train
from keras_attnconv.training.plan import check_run
from keras_attnconv.training.recipe import TrainConfig, load_recipe
from keras_attnconv.training.run_directory import RunDirectory, RunInUseError
from keras_attnconv.training.runs import finished_run
from keras_attnconv.training.workflow import export_source, train_and_export

__all__ = [
    "RunDirectory",
    "RunInUseError",
    "TrainConfig",
    "check_run",
    "export_source",
    "finished_run",
    "load_recipe",
    "train",
    "train_and_export",
]
