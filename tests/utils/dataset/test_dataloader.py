import itertools

import numpy as np
import pytest

from verl.utils.dataset.dataloader import StatefulDataLoader, create_rl_dataloader


class Rows:
    """A dataset of n rows whose items are their own index."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def as_list(items):
    return list(items)


def loader(n=10, batch_size=3, shuffle=True, seed=7, drop_last=True):
    return create_rl_dataloader(Rows(n), batch_size, shuffle, seed, drop_last, collate_fn=as_list)


def test_length_and_batches_without_shuffle():
    assert len(loader(10, 3, drop_last=True)) == 3
    assert len(loader(10, 3, drop_last=False)) == 4
    assert list(loader(10, 3, shuffle=False, drop_last=False)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_epoch_order_is_the_seeded_permutation():
    dl = loader(10, 5)
    expected0 = np.random.default_rng([7, 0]).permutation(10).tolist()
    expected1 = np.random.default_rng([7, 1]).permutation(10).tolist()
    assert list(itertools.chain(*dl)) == expected0
    assert list(itertools.chain(*dl)) == expected1
    assert expected0 != expected1
    assert dl.epoch == 2


def test_same_seed_same_batches_and_none_means_one():
    assert list(loader(seed=3)) == list(loader(seed=3))
    assert list(loader(seed=3)) != list(loader(seed=4))
    assert list(loader(seed=None)) == list(loader(seed=1))


def run(dl, steps):
    """Take `steps` batches across epochs, like a trainer's epoch loop."""
    out = []
    while len(out) < steps:
        for batch in dl:
            out.append(batch)
            if len(out) == steps:
                return out
    return out


@pytest.mark.parametrize("stop_after", [1, 2, 3, 4, 5])
def test_resume_reproduces_the_uninterrupted_run(stop_after):
    reference = run(loader(11, 3), 8)
    first = loader(11, 3)
    seen = run(first, stop_after)
    state = first.state_dict()
    resumed = loader(11, 3)
    resumed.load_state_dict(state)
    assert seen + run(resumed, 8 - stop_after) == reference


def test_state_after_the_last_batch_of_an_epoch():
    dl = loader(9, 3)
    batches = []
    for batch in dl:
        batches.append(batch)
        if len(batches) == 3:
            state = dl.state_dict()  # taken while training on the epoch's last batch
    assert state["epoch"] == 0 and state["batches_done"] == 3
    resumed = loader(9, 3)
    resumed.load_state_dict(state)
    assert list(resumed) == []  # that epoch is finished ...
    assert list(resumed) == list(dl)  # ... and the next one matches the uninterrupted run


def test_load_state_refuses_other_settings():
    state = loader(10, 3).state_dict()
    with pytest.raises(ValueError, match="batch_size=3"):
        loader(10, 2).load_state_dict(state)
    with pytest.raises(ValueError, match="num_rows=10"):
        loader(12, 3).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=7"):
        loader(10, 3, seed=8).load_state_dict(state)
    with pytest.raises(ValueError, match="batches_done"):
        loader(10, 3).load_state_dict(dict(state, batches_done=9))


def test_batch_larger_than_dataset():
    assert len(loader(2, 3, drop_last=True)) == 0
    assert list(loader(2, 3, shuffle=False, drop_last=False)) == [[0, 1]]
    with pytest.raises(ValueError, match="positive"):
        StatefulDataLoader(Rows(3), 0)
