"""Training data: Zipf-skewed synthetic recsys traffic and a Criteo-style TSV reader.

Both sources define *global* batches (the same for every world size) and each rank takes its
contiguous slice. That is what makes "2 ranks equal 1 rank with the same global batch" a
checkable statement. Synthetic batches are made on the training device when it is a GPU (by
the rank itself, a few dozen kernels); otherwise batches come from a DataLoader with worker
processes and, where an accelerator exists, pinned memory, as a real input pipeline would
(`Feed`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.profiler import record_function
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from recprof.errors import RecprofError
from recprof.nestpipe.config import TrainConfig

TRAIN_STREAM = 0
EVAL_STREAM = 1


@dataclass
class Batch:
    """One batch of samples; sparse ids are feature-major (all bags of feature 0, then 1, ...)."""

    dense: torch.Tensor  # (b, num_dense) float32
    ids: torch.Tensor  # (sum of lengths,) int64 raw ids
    lengths: torch.Tensor  # (num_features, b) int64 bag lengths
    labels: torch.Tensor  # (b,) float32 in {0, 1}

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    def pin_memory(self) -> Batch:
        """Called by the DataLoader's pin-memory thread (custom types must pin themselves)."""
        return Batch(*(t.pin_memory() for t in self._tensors()))

    def to(self, device: torch.device, dtype: torch.dtype) -> Batch:
        """On `device`, dense features and labels in the run's float `dtype` (their float32
        values convert exactly, so float32 and float64 runs train on the same inputs)."""
        return Batch(
            dense=self.dense.to(device, dtype, non_blocking=True),
            ids=self.ids.to(device, non_blocking=True),
            lengths=self.lengths.to(device, non_blocking=True),
            labels=self.labels.to(device, dtype, non_blocking=True),
        )

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return self.dense, self.ids, self.lengths, self.labels

    def select(self, samples: torch.Tensor) -> Batch:
        """The given samples, in that order, keeping the feature-major id layout."""
        flat = self.lengths.reshape(-1)
        starts = (torch.cumsum(flat, 0) - flat).view_as(self.lengths)
        new_starts = starts[:, samples].reshape(-1)
        new_lengths = self.lengths[:, samples].contiguous()
        lens = new_lengths.reshape(-1)
        within = torch.arange(int(lens.sum()), device=lens.device) - torch.repeat_interleave(
            torch.cumsum(lens, 0) - lens, lens
        )
        return Batch(
            dense=self.dense[samples],
            ids=self.ids[torch.repeat_interleave(new_starts, lens) + within],
            lengths=new_lengths,
            labels=self.labels[samples],
        )

    def slice(self, lo: int, hi: int) -> Batch:
        """Samples [lo, hi) of every feature, keeping the feature-major id layout."""
        (part,) = self.slices([lo, hi])
        return part

    def slices(self, bounds: Sequence[int]) -> list[Batch]:
        """Samples [bounds[i], bounds[i + 1]) of every feature for each i: one pass over the
        bags' offsets for all the parts (a rank's share of a 128-rank job's global batch,
        sliced 128 times, took as many passes over the whole batch)."""
        num_features, width = self.lengths.shape
        # offsets[f * width + i]: where bag i of feature f starts in ids (one past the last bag
        # included), so feature f's ids of samples [lo, hi) are offsets[.. + lo]:offsets[.. + hi]
        offsets = [0, *torch.cumsum(self.lengths.reshape(-1), 0).tolist()]
        parts = []
        for lo, hi in itertools.pairwise(bounds):
            pieces = [self.ids[offsets[f * width + lo] : offsets[f * width + hi]]
                      for f in range(num_features)]
            parts.append(Batch(
                dense=self.dense[lo:hi].contiguous(),
                ids=torch.cat(pieces) if pieces else self.ids[:0],
                lengths=self.lengths[:, lo:hi].contiguous(),
                labels=self.labels[lo:hi].contiguous(),
            ))
        return parts


#: Everything random in the synthetic stream is a 32-bit hash of (batch, quantity, position).
_MASK32 = 0xFFFFFFFF
#: The Zipf draw: the top bits of a draw pick one of 2**_QUANTILE_BITS equal-probability
#: quantile buckets (a lookup table), the remaining bits a raw id inside the bucket.
_QUANTILE_BITS = 20
_INSIDE_BITS = 32 - _QUANTILE_BITS
_SALT = 0xD1A7
#: Two-tower data: a candidate bag repeats its query's draws when its 32-bit coin is below this
#: (half of them).
_LINKED = 1 << 31


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """Wellons' lowbias32 (xorshift-multiply), in place on `x` (int64 in [0, 2**32)): a
    bijection of [0, 2**32) that mixes every bit. Integer operations only, so every device
    computes the same bits. The second multiplier is 2**31 or more, so it is applied as
    (c - 2**31) plus the low bit of x moved to 2**31: no int64 product overflows."""
    x ^= x >> 16
    x.mul_(0x7FEB352D).bitwise_and_(_MASK32)
    x ^= x >> 15
    low = (x & 1) << 31
    x.mul_(0x846CA68B - (1 << 31)).add_(low).bitwise_and_(_MASK32)
    x ^= x >> 16
    return x


def _bits(counter: torch.Tensor, key: int) -> torch.Tensor:
    """32 random bits per counter under `key`: the counter goes through an affine bijection
    that depends on the key, then `_hash32`, so two keys (batches, quantities) never give each
    other's bits at shifted positions. `counter` must lie in [0, 2**32)."""
    odd, offset = (key & 0x7FFFFFFF) | 1, _hash_int(key)
    return _hash32((counter * odd).add_(offset).bitwise_and_(_MASK32))


def _hash_int(x: int) -> int:
    """`_hash32` of a Python int (keys are derived on the host)."""
    x &= _MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


@dataclass(frozen=True)
class _Sparse:
    """A slice of a batch's sparse side: bag lengths (features x samples), each id's position
    in the Zipf order (feature-major, bag by bag), and the map from a per-bag value to its
    slots' (a per-bag value minus the bag's start, repeated over the bag, plus the slot)."""

    lengths: torch.Tensor
    at: torch.Tensor
    per_slot: Callable[[torch.Tensor], torch.Tensor]


class SyntheticSource:
    """Recsys-like traffic with a planted signal, a pure function of (seed, stream, index).

    Per feature, key popularity follows Zipf(alpha) over `vocab_size` raw ids (popular ids are
    scattered by a fixed permutation, not clustered at 0), bag lengths vary in [1, bag_size],
    and the label is Bernoulli(p(dense . w + sum_f mean_bag score_f[id])), p a sigmoid, so the
    model can learn something and eval AUC measures it.

    Every random number is a counter-based hash of (seed, stream, batch, quantity, the global
    sample and slot it belongs to), computed with torch on whatever device the source lives on
    (`to`): a rank generates exactly its own samples, vectorised, on its GPU when it has one,
    and gets bit for bit the same batch on any device and for any world size, because every
    step is integer arithmetic or an IEEE-exact float operation in a fixed order (no
    transcendental function, no parallel reduction). The tables it reads (id permutation,
    scores, dense weights, Zipf quantiles) are drawn once by numpy on the host.
    """

    def __init__(self, cfg: TrainConfig, device: torch.device | None = None) -> None:
        self.cfg = cfg
        self.device = device or torch.device("cpu")
        v, nf = cfg.vocab_size, cfg.num_features
        ranks = np.arange(1, v + 1, dtype=np.float64)
        weights = ranks ** (-cfg.zipf_alpha)
        cdf = np.cumsum(weights) / weights.sum()
        # Row b of the quantile table: the first 0-based popularity rank whose cdf exceeds
        # b / 2**bits and the one for b + 1; a draw in bucket b lands on a rank between them
        # (one gather reads both).
        edges = np.arange((1 << _QUANTILE_BITS) + 1, dtype=np.float64) / (1 << _QUANTILE_BITS)
        quantile = np.minimum(np.searchsorted(cdf, edges, side="right"), v - 1)
        rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, _SALT]))
        perm = np.stack([rng.permutation(v) for _ in range(nf)])
        scores = rng.normal(0.0, cfg.signal_scale, (nf, v))
        dense_w = rng.normal(0.0, 0.5 / np.sqrt(max(cfg.num_dense, 1)), cfg.num_dense)
        self.quantile = torch.from_numpy(np.stack([quantile[:-1], quantile[1:]], axis=1)
                                         .astype(np.int32)).to(self.device)
        self.perm = torch.from_numpy(perm.reshape(-1).astype(np.int64)).to(self.device)
        self.scores = torch.from_numpy(scores.reshape(-1)).to(self.device)
        self.dense_w = dense_w.tolist()  # Python floats: each weighs one dense column

    def to(self, device: torch.device) -> SyntheticSource:
        """The same source generating on `device` (its tables copied there once)."""
        return self if device == self.device else SyntheticSource(self.cfg, device)

    def global_batch(self, stream: int, index: int) -> Batch:
        return self.samples(stream, index, 0, self.cfg.batch_size)

    def _keys(self, stream: int, index: int) -> list[int]:
        """The hash keys of one batch's dense values, bag lengths, ids, label coins and
        (two-tower) which candidate bags repeat their query's draws."""
        batch = _hash_int(_hash_int(_hash_int(self.cfg.seed ^ _SALT) ^ stream) ^ index)
        return [_hash_int(batch ^ quantity) for quantity in range(5)]

    def samples(self, stream: int, index: int, lo: int, hi: int) -> Batch:
        """Samples [lo, hi) of global batch `index`, equal to `global_batch(...).slice(lo, hi)`.

        Only these samples' numbers are made: sample j's are hashes of counters that name j
        (its dense column, its bag of feature f, the slot in that bag), not draws from a
        stream that would have to be advanced past the samples before lo.
        """
        cfg, dev = self.cfg, self.device
        n, bag, nd = hi - lo, cfg.bag_size, cfg.num_dense
        k_dense, _, _, k_coin, _ = self._keys(stream, index)
        sparse = self._sparse(stream, index, lo, hi)
        sample = torch.arange(lo, hi, device=dev)
        # Dense: two 16-bit uniforms per value, summed: a triangle of unit variance.
        h = _bits(sample[:, None] * nd + torch.arange(nd, device=dev), k_dense)
        dense = ((((h & 0xFFFF) + (h >> 16) + 1).double() / 65536.0 - 1.0)
                 * 6.0 ** 0.5).float()
        # Label: each bag's mean score, summed slot by slot and feature by feature in a fixed
        # order; p = 1/2 + z / (2 sqrt(1 + z^2)) with z = logit / 2 has the logistic's slope
        # at 0 and needs only IEEE-exact operations.
        nbags = cfg.num_features * n
        grid = torch.zeros(nbags, bag, dtype=torch.float64, device=dev)
        grid.view(-1)[sparse.per_slot(torch.arange(nbags, device=dev) * bag)] = \
            self.scores.index_select(0, sparse.at)
        sums = grid[:, 0].clone()
        for s in range(1, bag):
            sums += grid[:, s]
        means = (sums / sparse.lengths.reshape(-1)).view(cfg.num_features, n)
        logit = torch.zeros(n, dtype=torch.float64, device=dev)
        for d, w in enumerate(self.dense_w):
            logit += dense[:, d].double() * w
        for f in range(cfg.num_features):
            logit += means[f]
        z = logit * 0.5
        p = 0.5 + 0.5 * z / torch.sqrt(1.0 + z * z)
        coin = (_bits(sample, k_coin).double() + 0.5) / 4294967296.0
        return Batch(dense=dense, ids=self.perm.index_select(0, sparse.at),
                     lengths=sparse.lengths, labels=(coin < p).float())

    def routing_batch(self, stream: int, index: int) -> Batch:
        """Global batch `index` as routing sees it: the same ids and bag lengths as
        `global_batch`, no dense features, labels 0. The what-if counts each knob's traffic
        on the job's own batches (nestpipe/traffic.py); the dense values and labels it never
        reads were most of the cost of a 128-rank job's batches."""
        n = self.cfg.batch_size
        sparse = self._sparse(stream, index, 0, n)
        return Batch(dense=torch.zeros(n, 0, device=self.device),
                     ids=self.perm.index_select(0, sparse.at), lengths=sparse.lengths,
                     labels=torch.zeros(n, device=self.device))

    def _sparse(self, stream: int, index: int, lo: int, hi: int) -> _Sparse:
        """Samples [lo, hi)'s bag lengths and their ids' positions in the Zipf order."""
        cfg, dev = self.cfg, self.device
        n, size, bag = hi - lo, cfg.batch_size, cfg.bag_size
        nf = cfg.num_features
        _, k_length, k_id, _, k_link = self._keys(stream, index)
        sample = torch.arange(lo, hi, device=dev)
        feature = torch.arange(nf, device=dev)[:, None]
        lengths = 1 + ((_bits(feature * size + sample, k_length) * bag) >> 32)  # (nf, n)
        flat = lengths.reshape(-1)
        total = int(flat.sum())
        # Per id (feature-major, bag by bag): a per-bag value repeated over the bag's slots,
        # plus the slot; bag b is (feature b // n, sample lo + b % n).
        bags, pos = torch.arange(nf * n, device=dev), torch.arange(total, device=dev)
        starts = torch.cumsum(flat, 0) - flat

        def per_slot(per_bag: torch.Tensor) -> torch.Tensor:
            return torch.repeat_interleave(per_bag - starts, flat, output_size=total) + pos

        f_of = bags // n
        counter = (f_of * (size - n) + lo + bags) * bag  # (feature, global sample) x bag
        if cfg.model == "two_tower":
            # Half the candidate bags draw their ids with the query's first feature's counters:
            # the same Zipf positions, each feature's own permutation (`perm`) making them other
            # raw ids. A query's candidate is then predictable from its ids, so recall measures
            # what the towers learned; the other half are independent draws.
            linked = (f_of >= cfg.query_features) & (_bits(counter, k_link) < _LINKED)
            counter = torch.where(linked, (lo + bags % n) * bag, counter)
        h = _bits(per_slot(counter), k_id)
        inside = h & ((1 << _INSIDE_BITS) - 1)
        first, last = self.quantile.index_select(0, h >> _INSIDE_BITS).long().unbind(1)
        at = first + ((inside * (last - first + 1)) >> _INSIDE_BITS)
        at += torch.repeat_interleave(f_of * cfg.vocab_size, flat, output_size=total)
        return _Sparse(lengths, at, per_slot)


def _parse_tsv_line(line: str, num_dense: int, num_features: int) -> tuple:
    """label, dense ints (log1p of the non-negative part), categorical fields (hex, ','-multi)."""
    cols = line.rstrip("\n").split("\t")
    if len(cols) != 1 + num_dense + num_features:
        raise RecprofError(
            f"data_path: a line has {len(cols)} columns, expected 1 + num_dense ({num_dense}) "
            f"+ num_features ({num_features})"
        )
    try:
        label = float(cols[0])
        dense = [float(np.log1p(max(float(c), 0.0))) if c else 0.0 for c in cols[1 : 1 + num_dense]]
        cats = [[int(v, 16) for v in c.split(",") if v] for c in cols[1 + num_dense :]]
    except ValueError as exc:
        raise RecprofError(f"data_path: unparsable field: {exc}") from None
    return label, dense, cats


def tsv_batch(lines: list[str], num_dense: int, num_features: int) -> Batch:
    """Build a batch from Criteo-style lines: label, dense columns, then categorical columns."""
    parsed = [_parse_tsv_line(line, num_dense, num_features) for line in lines]
    ids: list[int] = []
    lengths = np.zeros((num_features, len(parsed)), dtype=np.int64)
    for f in range(num_features):
        for i, (_, _, cats) in enumerate(parsed):
            ids.extend(cats[f])
            lengths[f, i] = len(cats[f])
    return Batch(
        dense=torch.tensor([p[1] for p in parsed], dtype=torch.float32).reshape(-1, num_dense),
        ids=torch.tensor(ids, dtype=torch.int64),
        lengths=torch.from_numpy(lengths),
        labels=torch.tensor([p[0] for p in parsed], dtype=torch.float32),
    )


class StepDataset(IterableDataset):
    """Yields this rank's slice of global batches `first .. first+count-1`, in order.

    Worker w of W produces batches w, w+W, ...; the DataLoader takes workers round-robin, so
    the trainer still sees them in step order.
    """

    def __init__(self, cfg: TrainConfig, stream: int, count: int, rank: int, world: int) -> None:
        self.cfg, self.stream, self.count = cfg, stream, count
        local = cfg.batch_size // world
        self.lo, self.hi = rank * local, (rank + 1) * local
        self.source = SyntheticSource(cfg) if cfg.data == "synthetic" else None
        if cfg.data == "tsv":
            use_eval = stream == EVAL_STREAM and bool(cfg.eval_data_path)
            self.path = Path(cfg.eval_data_path if use_eval else cfg.data_path)
            if not self.path.is_file():
                raise RecprofError(f"data_path: no such file {self.path}")

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.source is not None:
            for index in range(wid, self.count, nw):
                yield self.source.samples(self.stream, index, self.lo, self.hi)
        else:
            yield from self._tsv(wid, nw)

    def _tsv(self, wid: int, nw: int) -> Iterator[Batch]:
        """Read the file in global batches of batch_size lines, cycling over it as epochs."""
        cfg, index, chunk = self.cfg, 0, []
        while index < self.count:
            seen = 0
            with self.path.open() as fh:
                for line in fh:
                    seen += 1
                    chunk.append(line)
                    if len(chunk) < cfg.batch_size:
                        continue
                    if index % nw == wid:
                        yield tsv_batch(chunk[self.lo : self.hi], cfg.num_dense, cfg.num_features)
                    chunk, index = [], index + 1
                    if index >= self.count:
                        return
            if seen < cfg.batch_size:
                raise RecprofError(
                    f"data_path: {self.path} has {seen} lines, fewer than batch_size"
                )


def make_loader(
    cfg: TrainConfig, stream: int, count: int, rank: int, world: int, workers: int,
    device: torch.device,
) -> DataLoader:
    """This rank's batches; pinned memory only where they are copied to a GPU (a gloo run on
    a GPU host trains on CPU and pins for nothing)."""
    return DataLoader(
        StepDataset(cfg, stream, count, rank, world),
        batch_size=None,
        num_workers=workers,
        pin_memory=cfg.pin_memory and device.type == "cuda",
        prefetch_factor=4 if workers > 0 else None,
        persistent_workers=False,
    )


class Feed:
    """This rank's batches of one stream, in step order, on the training device in the run's
    float dtype: `next()` takes one under `nestpipe:data_wait` and copies it under
    `nestpipe:h2d`.

    Synthetic data on an accelerator is generated there, by the rank itself: a few dozen
    elementwise kernels, no worker process, no pinned buffer, no copy, so a GPU step is not
    paced by host cores (one DataLoader worker held a one-GPU step at batch 16,384 to 85 ms,
    76% of it waiting for data; gpu/SOURCES.md). Everything else (synthetic data on CPU, TSV
    files anywhere) comes from a DataLoader with `workers` processes, pinned where it is
    copied to a device, and a non-blocking copy. Either way the batch is issued on the
    current stream, which is DBP's copy stream when DBP prepares it (schedule.py).
    """

    def __init__(self, cfg: TrainConfig, stream: int, count: int, rank: int, world: int,
                 workers: int, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype, self.stream = device, dtype, stream
        self.source: SyntheticSource | None = None
        self.batches: Iterator[Batch] | None = None
        if cfg.data == "synthetic" and device.type != "cpu":
            local = cfg.batch_size // world
            self.source = SyntheticSource(cfg, device)
            self.lo, self.hi, self.index = rank * local, (rank + 1) * local, 0
        else:
            self.batches = iter(make_loader(cfg, stream, count, rank, world, workers, device))
        #: Host seconds spent in `nestpipe:data_wait` since the last `take_wait()`.
        self.wait_s = 0.0

    def next(self) -> Batch:
        """The next batch, on the device, in the run's dtype."""
        started = time.perf_counter()
        with record_function("nestpipe:data_wait"):
            if self.source is not None:
                batch = self.source.samples(self.stream, self.index, self.lo, self.hi)
                self.index += 1
            else:
                assert self.batches is not None
                batch = next(self.batches)
        self.wait_s += time.perf_counter() - started
        with record_function("nestpipe:h2d"):
            return batch.to(self.device, self.dtype)

    def take_wait(self) -> float:
        """Seconds waited for data since the last call (the trainer logs it per step)."""
        waited, self.wait_s = self.wait_s, 0.0
        return waited
