"""The global random generators a backup keeps (PyTorch's), set again on resuming."""

import keras
import pytest

from keras_attnconv.training import global_generators

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="only PyTorch draws from global generators a backup must keep"
)


def test_the_cpu_generator_resumes_where_it_was_saved():
    import torch

    torch.manual_seed(3)
    saved = global_generators.states()
    expected = torch.rand(5)
    torch.manual_seed(4)
    global_generators.set_states(saved)
    assert torch.equal(torch.rand(5), expected)


class _FakeGpus:
    """`torch.cuda`'s generator functions for `count` GPUs, recording which states were set on which GPU."""

    def __init__(self, count):
        self.count = count
        self.set = {}

    def install(self, monkeypatch, torch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: self.count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self._set_rng_state)
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", self._set_rng_state_all)

    def _set_rng_state(self, state, device="cuda"):
        if not isinstance(device, int) or not 0 <= device < self.count:
            raise RuntimeError(f"Invalid device {device!r}: {self.count} GPUs")
        self.set[device] = state

    def _set_rng_state_all(self, states):
        for index, state in enumerate(states):
            self._set_rng_state(state, index)


@pytest.mark.parametrize("gpus_now", [0, 1, 3])
def test_a_backup_of_two_gpus_resumes_on_as_many_gpus_as_the_machine_has(monkeypatch, gpus_now):
    import torch

    saved = {**global_generators.states(), "cuda0": torch.arange(8, dtype=torch.uint8).numpy()}
    saved["cuda1"] = saved["cuda0"] + 1
    fake = _FakeGpus(gpus_now)
    fake.install(monkeypatch, torch)
    global_generators.set_states(saved)
    # Each GPU present that the backup knows gets its own state; the others keep theirs.
    assert sorted(fake.set) == list(range(min(gpus_now, 2)))
    for index, state in fake.set.items():
        assert state.tolist() == saved[f"cuda{index}"].tolist()
