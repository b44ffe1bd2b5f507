"""The global random generators a backup keeps besides the model's own random streams: PyTorch's.

Keras on PyTorch draws a dropout layer without a seed from torch's global
generators (the CPU's and each GPU's) rather than from the layer's random
stream; on TensorFlow and JAX every draw comes from the streams, which are
model variables. A resumed run repeats an uninterrupted one only if it
draws the same masks, so `ResumableBackup` saves these states with each
epoch and sets them again when the resumed run's training begins.
"""

import keras
import numpy as np


def _torch():
    """PyTorch's module on that backend (Keras has imported it already), else None: no global generator to keep."""
    if keras.backend.backend() != "torch":
        return None
    import torch

    return torch


def states():
    """The global generators' states as arrays named ``cpu``, ``cuda0``, ...; {} on TensorFlow and JAX."""
    torch = _torch()
    if torch is None:
        return {}
    saved = {"cpu": torch.get_rng_state().numpy()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        saved.update({f"cuda{i}": state.numpy() for i, state in enumerate(torch.cuda.get_rng_state_all())})
    return saved


def read_states(path):
    """The `states` saved in `path` (``np.savez``); {} where there are none (backups of earlier versions or
    of another backend) or this backend has no global generator to set."""
    if _torch() is None or not path.exists():
        return {}
    with np.load(path) as saved:
        return {name: saved[name] for name in saved.files}


def set_states(saved):
    """Sets the global generators to `saved` (`read_states`); nothing where it is {}."""
    if not saved:
        return
    torch = _torch()
    torch.set_rng_state(torch.from_numpy(saved["cpu"]))
    # Each GPU present gets its own saved state, by index. A backup written on a machine with more GPUs
    # (Keras on PyTorch trains on the first) resumes on fewer: `torch.cuda.set_rng_state_all` would fail
    # there, as it indexes every GPU of the list. One with more keeps the new GPUs' states as they are.
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index in range(present):
        if f"cuda{index}" in saved:
            torch.cuda.set_rng_state(torch.from_numpy(saved[f"cuda{index}"]), index)
