"""A resumed run's TensorBoard logs, rewound to its last backup as its ``history.csv`` is (`callbacks.rewind_csv`).

Keras' TensorBoard callback writes each epoch's metrics at the step of the
epoch and each evaluation's at the optimizer's iterations (the tags
``evaluation_<metric>_vs_iterations``), into ``logs/train/`` and
``logs/validation/``, one event file per process. A run killed after logging
an epoch but before publishing its backup redoes that epoch in the next
process: without the rewind, TensorBoard would draw the epoch twice, once from
each process's file.
"""

from pathlib import Path

from keras_attnconv.utils.files import write_atomically

#: The event files of Keras' TensorBoard callback, one folder per writer (train, validation).
EVENT_FILES = "*/events.out.tfevents.*"
#: The ending of the tags Keras logs at the optimizer's step rather than the epoch (its evaluations).
ITERATION_TAG_SUFFIX = "_vs_iterations"


def rewind_event_files(logs_dir, initial_epoch, iterations):
    """Drops from the event files under `logs_dir` every summary of an epoch from `initial_epoch` on.

    An epoch's summaries are those at step `initial_epoch` or later, and the
    evaluations at more than `iterations` (the optimizer's steps when the
    backup was taken). A file is rewritten, atomically, only where something is
    dropped (a record that a kill left half-written at its end goes with it);
    its other events (the file's version, graphs) stay as they were. Returns
    the number of summaries dropped.
    """
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    def backed_up(tag, step):
        return step <= iterations if tag.endswith(ITERATION_TAG_SUFFIX) else step < initial_epoch

    dropped = 0
    for path in sorted(Path(logs_dir).glob(EVENT_FILES)):
        records = list(RawEventFileLoader(str(path)).Load())
        kept = []
        for record in records:
            event = event_pb2.Event.FromString(record)
            values = [value for value in event.summary.value if backed_up(value.tag, event.step)]
            if len(values) < len(event.summary.value):
                dropped += len(event.summary.value) - len(values)
                if not values:
                    continue
                del event.summary.value[:]
                event.summary.value.extend(values)
                record = event.SerializeToString()
            kept.append(record)
        if kept != records:
            write_atomically(path, lambda tmp, kept=kept: _write_records(tmp, kept))
    return dropped


def _write_records(path, records):
    from tensorboard.summary.writer.record_writer import RecordWriter

    with open(path, "wb") as file:
        writer = RecordWriter(file)
        for record in records:
            writer.write(record)
        writer.flush()
