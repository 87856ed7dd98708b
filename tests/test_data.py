"""tracegrad.utils.data without torch: datasets, the DataLoader's batching,
shuffling with a seeded Generator, drop_last, samplers, collation, and
random_split."""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.utils.data import (DataLoader, Dataset, IterableDataset, TensorDataset,
                                  ConcatDataset, Subset, random_split, BatchSampler,
                                  SequentialSampler, RandomSampler, default_collate)


def _ds(n=10):
    return TensorDataset(tg.tensor(np.arange(2.0 * n).reshape(n, 2)), tg.arange(n))


def test_torch_names_are_reachable():
    import tracegrad as torch
    assert torch.utils.data.DataLoader is DataLoader
    assert isinstance(torch.Generator().manual_seed(1), torch.Generator)


def test_tensor_dataset_and_sequential_batches():
    ds = _ds()
    assert len(ds) == 10
    x, y = ds[3]
    np.testing.assert_array_equal(x.numpy(), [6.0, 7.0])
    assert int(y) == 3
    dl = DataLoader(ds, batch_size=4)
    batches = list(dl)
    assert len(dl) == 3 and len(batches) == 3
    assert [tuple(b[0].shape) for b in batches] == [(4, 2), (4, 2), (2, 2)]
    np.testing.assert_array_equal(np.concatenate([b[1].numpy() for b in batches]), np.arange(10))
    dl = DataLoader(ds, batch_size=4, drop_last=True)
    assert len(dl) == 2 and [len(b[1].numpy()) for b in dl] == [4, 4]
    with pytest.raises(AssertionError, match="Size mismatch"):
        TensorDataset(tg.zeros(3), tg.zeros(4))


def test_shuffle_with_a_seeded_generator_is_a_reproducible_permutation():
    ds = _ds(20)

    def order(seed):
        g = tg.Generator().manual_seed(seed)
        return np.concatenate([yb.numpy() for _, yb in DataLoader(ds, batch_size=6,
                                                                   shuffle=True, generator=g)])

    a, b, c = order(0), order(0), order(1)
    assert sorted(a.tolist()) == list(range(20))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    g = tg.Generator().manual_seed(3)
    dl = DataLoader(ds, batch_size=20, shuffle=True, generator=g)
    e1, e2 = next(iter(dl))[1].numpy(), next(iter(dl))[1].numpy()
    assert not np.array_equal(e1, e2)        # a new order each epoch
    # without a generator: tracegrad's global one, seeded by manual_seed
    tg.manual_seed(5)
    d1 = next(iter(DataLoader(ds, batch_size=20, shuffle=True)))[1].numpy()
    tg.manual_seed(5)
    d2 = next(iter(DataLoader(ds, batch_size=20, shuffle=True)))[1].numpy()
    np.testing.assert_array_equal(d1, d2)


def test_default_collate_of_numbers_arrays_tuples_dicts():
    Point = namedtuple("Point", "x y")
    out = default_collate([{"a": 1.5, "b": np.array([1, 2]), "c": (1, "s")},
                           {"a": 2.5, "b": np.array([3, 4]), "c": (2, "t")}])
    assert out["a"].dtype == np.float64 and out["a"].tolist() == [1.5, 2.5]
    assert out["b"].tolist() == [[1, 2], [3, 4]]
    assert out["c"][0].dtype == np.int64 and out["c"][1] == ["s", "t"]
    p = default_collate([Point(1, 2.0), Point(3, 4.0)])
    assert isinstance(p, Point) and p.x.tolist() == [1, 3]
    t = default_collate([tg.tensor([1.0, 2.0]), tg.tensor([3.0, 4.0])])
    assert isinstance(t, tg.Tensor) and t.shape == (2, 2)


class Squares(Dataset):
    def __len__(self):
        return 5

    def __getitem__(self, i):
        return np.float64(i * i), i


class Counter(IterableDataset):
    def __iter__(self):
        return iter(range(7))

    def __len__(self):
        return 7


def test_map_and_iterable_datasets_samplers_and_options():
    dl = DataLoader(Squares(), batch_size=2)
    xs = [b[0].tolist() for b in dl]
    assert xs == [[0.0, 1.0], [4.0, 9.0], [16.0]]
    assert [s for s in DataLoader(Squares(), batch_size=None)][2] == (4.0, 2)
    it = [b.tolist() for b in DataLoader(Counter(), batch_size=3)]
    assert it == [[0, 1, 2], [3, 4, 5], [6]] and len(DataLoader(Counter(), batch_size=3)) == 3
    bs = BatchSampler(SequentialSampler(range(5)), 2, drop_last=False)
    assert list(bs) == [[0, 1], [2, 3], [4]] and len(bs) == 3
    dl = DataLoader(Squares(), batch_sampler=[[4, 0], [1]])
    assert [b[1].tolist() for b in dl] == [[4, 0], [1]]
    rs = RandomSampler(range(4), replacement=True, num_samples=9,
                       generator=tg.Generator().manual_seed(0))
    draws = list(rs)
    assert len(draws) == 9 and set(draws) <= {0, 1, 2, 3}
    dl = DataLoader(Squares(), batch_size=2, collate_fn=lambda b: len(b))
    assert list(dl) == [2, 2, 1]
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        DataLoader(Squares(), sampler=SequentialSampler(range(5)), shuffle=True)
    with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive"):
        DataLoader(Squares(), batch_sampler=[[0]], batch_size=2)
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(Counter(), shuffle=True)


def test_random_split_concat_and_subset():
    parts = random_split(range(10), [3, 7], generator=tg.Generator().manual_seed(0))
    assert [len(p) for p in parts] == [3, 7]
    assert sorted(list(parts[0]) + list(parts[1])) == list(range(10))
    again = random_split(range(10), [3, 7], generator=tg.Generator().manual_seed(0))
    assert list(again[0]) == list(parts[0])
    fr = random_split(range(11), [0.5, 0.5], generator=tg.Generator().manual_seed(0))
    assert [len(p) for p in fr] == [6, 5]      # the remainder goes round-robin
    with pytest.raises(ValueError, match="Sum of input lengths"):
        random_split(range(10), [3, 3])
    cat = ConcatDataset([range(3), range(10, 12)])
    assert len(cat) == 5 and [cat[i] for i in range(5)] == [0, 1, 2, 10, 11] and cat[-1] == 11
    sub = Subset(range(10, 20), [5, 1])
    assert len(sub) == 2 and sub[0] == 15


def test_tensor_dataset_batches_in_one_gather_equal_stacked_samples():
    # the DataLoader gathers a TensorDataset's batch in one index when its
    # tensors take no gradient and the collation is the default: the same
    # batches, dtypes and shapes as stacking the samples one by one
    rng = np.random.default_rng(0)
    ds = TensorDataset(tg.tensor(rng.normal(size=(23, 1, 3, 3)).astype(np.float32)),
                       tg.tensor(rng.integers(0, 9, 23)), tg.tensor(rng.random(23) > 0.5))

    def run(collate):
        dl = DataLoader(ds, batch_size=5, shuffle=True, collate_fn=collate,
                        generator=tg.Generator().manual_seed(3))
        return [tuple(t.numpy() for t in b) for b in dl]

    fast = run(None)
    slow = run(lambda batch: default_collate(batch))   # another collate: sample by sample
    assert len(fast) == len(slow) == 5
    for f, s in zip(fast, slow):
        for a, b in zip(f, s):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
    # a tensor that takes gradients keeps the per-sample path (its rows record)
    w = tg.tensor(np.arange(6.0), requires_grad=True)
    (b,) = next(iter(DataLoader(TensorDataset(w), batch_size=3)))
    assert b.requires_grad and b.grad_fn is not None
