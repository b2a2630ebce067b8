"""Communication cost per collective kind, fitted on the run's own collective instances.

Each instance's transfer is its duration minus the longer of the time it spent waiting for
later ranks (the analysis' cross-rank matching) and the time it sat behind the rank's earlier
collectives still in flight (the replay queues those itself); a line `latency + bytes /
bandwidth` is fitted per kind by non-negative least squares. A kind seen at one message size
cannot separate latency from bandwidth: it takes the link's bandwidth from the best-spread kind
(converted with nccl-tests' bus factors, since an all-reduce moves 2(n-1)/n of its bytes per
rank and an all-to-all (n-1)/n) and keeps its own latency. Each fit says what it rests on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from recprof.analysis.model import CollectiveSample
from recprof.trace.vocabulary import bus_factor

#: Below this spread of message sizes (largest / smallest) a kind's latency cannot be told
#: from its bandwidth; its line then goes through the origin.
MIN_SIZE_SPREAD = 2.0


@dataclass(frozen=True)
class LinkFit:
    """`transfer_us(bytes) = latency_us + bytes / bytes_per_us` for one collective kind."""

    kind: str
    latency_us: float
    bytes_per_us: float
    points: int
    min_bytes: float
    max_bytes: float
    borrowed_from: str | None = None  # the kind whose bandwidth a one-size kind uses

    def transfer_us(self, nbytes: float) -> float:
        return self.latency_us + nbytes / self.bytes_per_us

    def describe(self) -> str:
        gbit = self.bytes_per_us * 8e6 / 1e9
        basis = (f"bandwidth of {self.borrowed_from} (one message size here)"
                 if self.borrowed_from else "fitted")
        return (f"{self.kind}: {self.latency_us:.0f} us + bytes at {gbit:.2f} Gbit/s "
                f"({basis}; {self.points} instances of {self.min_bytes:,.0f}-"
                f"{self.max_bytes:,.0f} B)")


def transfer_us(sample: CollectiveSample) -> float:
    """The instance's own transfer: its duration less the longer of its wait for later ranks
    and its time behind the rank's earlier collectives (the replay queues those on the link
    itself; counted in the fit too, a dense all-reduce posted behind an all-to-all would
    fit the all-to-all's transfer as the all-reduce's latency)."""
    return max(sample.dur_us - max(sample.wait_us or 0.0, sample.queued_us), 0.0)


def fit_links(samples: list[CollectiveSample], group_size: int,
              members: Callable[[CollectiveSample], int] | None = None) -> dict[str, LinkFit]:
    """One line per collective kind with at least one sized instance, in bytes of a collective
    over `group_size` ranks. `members` gives an instance's own group size where the job's
    groups are known (the built-in trainer's config): an instance over a group of another size
    counts as the bytes that move as many bytes per rank at `group_size`, and one over a group
    of one, which never reaches the wire (HSP with one rank per sharding group), is left out;
    fitted in, its microseconds for megabytes made the link look hundreds of times faster
    than the one the other collectives crossed."""
    by_kind: dict[str, list[tuple[float, CollectiveSample]]] = {}
    for s in samples:
        size = members(s) if members else group_size
        if not s.bytes or s.bytes <= 0 or (members and size == 1):
            continue
        scale = bus_factor(s.kind, size) / bus_factor(s.kind, group_size)
        by_kind.setdefault(s.kind, []).append((s.bytes * scale, s))
    points = {kind: (np.array([b for b, _ in group], dtype=float),
                     np.array([transfer_us(s) for _, s in group], dtype=float))
              for kind, group in by_kind.items()}
    fits: dict[str, LinkFit] = {}
    for kind, (x, y) in points.items():
        if x.max() / x.min() >= MIN_SIZE_SPREAD:
            (latency, per_byte), _ = nnls(np.column_stack([np.ones_like(x), x]), y)
            if per_byte > 0:
                fits[kind] = LinkFit(kind, float(latency), float(1.0 / per_byte), len(x),
                                     float(x.min()), float(x.max()))
    for kind, (x, y) in points.items():
        if kind in fits:
            continue
        donor = max(fits.values(), key=lambda f: f.max_bytes / f.min_bytes, default=None)
        if donor is None:
            # Nothing spread anywhere: a line through the origin, all of it bandwidth.
            rate = float(np.median(x) / max(np.median(y), 1e-9))
            fits[kind] = LinkFit(kind, 0.0, rate, len(x), float(x.min()), float(x.max()))
            continue
        rate = _borrowed_rate(donor, kind, group_size)
        latency = max(float(np.median(y) - np.median(x) / rate), 0.0)
        fits[kind] = LinkFit(kind, latency, float(rate), len(x), float(x.min()), float(x.max()),
                             borrowed_from=donor.kind)
    return fits


#: The hosts a collective's members ran on, sorted: one host is a link inside a node, two a
#: host pair's link, more the links between all of them.
Span = tuple[str, ...]


def fit_spans(samples: list[CollectiveSample], group_size: int,
              members: Callable[[CollectiveSample], tuple[int, ...]],
              host_of: dict[int, str | None]) -> dict[tuple[str, Span], LinkFit]:
    """One line per collective kind and span of hosts, where the run's instances cross more
    than one span (inside a node and between nodes, or between different host pairs): a
    collective is priced on the link its members' hosts use. {} when every instance has the
    same span: the kinds' lines (`fit_links`) are the links then."""
    def span(s: CollectiveSample) -> Span:
        return tuple(sorted({str(host_of.get(m)) for m in members(s)}))

    by_span: dict[Span, list[CollectiveSample]] = {}
    for s in samples:
        by_span.setdefault(span(s), []).append(s)
    if len(by_span) < 2:
        return {}
    fits: dict[tuple[str, Span], LinkFit] = {}
    for key, group in by_span.items():
        for kind, fit in fit_links(group, group_size, lambda s: len(members(s))).items():
            fits[(kind, key)] = fit
    return fits


def describe_span(kind: str, span: Span) -> str:
    """How a line of `fit_spans` reads: `all_to_all inside a` / `all_to_all across a, b`."""
    return f"{kind} {'inside' if len(span) == 1 else 'across'} {', '.join(span)}"


def _borrowed_rate(donor: LinkFit, kind: str, group_size: int) -> float:
    """The bytes per us of `kind` on the link `donor` measured: the same bytes per rank on the
    wire (nccl-tests' bus factors)."""
    return donor.bytes_per_us * bus_factor(donor.kind, group_size) / max(
        bus_factor(kind, group_size), 1e-9)


@dataclass(frozen=True)
class Network:
    """Transfer times of a (possibly larger) job: the run's fitted lines inside a node, and
    an inter-node link of a given rate for collectives whose members span nodes."""

    links: dict[str, LinkFit]
    ranks_per_node: int
    #: the group size the lines were fitted at: a collective over more ranks moves more of
    #: its message per rank (nccl-tests' bus factor: an all-to-all (n-1)/n, a ring 2(n-1)/n)
    fitted_group: int
    inter_bytes_per_us: float | None = None  # None: one node, or the fits already span nodes
    #: Multiplies transfers (those the plan does not know to run alone: `fitted` leaves it
    #: out): what the recorded step shows collectives cost beyond their fitted lines
    #: (contention for cores and links while they run), from calibration.
    contention: float = 1.0
    #: Lines per kind and span of hosts where the run's collectives crossed several
    #: (`fit_spans`), and the host of each captured rank (by rank) to find a collective's.
    spans: dict[tuple[str, Span], LinkFit] = field(default_factory=dict)
    hosts: dict[int, str | None] = field(default_factory=dict)

    def line(self, kind: str, members: tuple[int, ...]) -> LinkFit:
        """The line a collective of `kind` over `members` is priced on: its span of hosts' own
        where the run fitted one, else its kind's (`link`)."""
        if self.spans and all(m in self.hosts for m in members):
            key = (kind, tuple(sorted({str(self.hosts[m]) for m in members})))
            if key in self.spans:
                return self.spans[key]
        return self.link(kind)

    def link(self, kind: str) -> LinkFit:
        """The fitted line of `kind`, or one at the bandwidth of the nearest kind the run has
        (the same bytes per rank on the wire) and its latency."""
        if kind in self.links:
            return self.links[kind]
        for candidate in ("all_to_all", "all_reduce", *self.links):
            if candidate in self.links:
                donor = self.links[candidate]
                return dataclasses.replace(
                    donor, kind=kind, borrowed_from=donor.kind,
                    bytes_per_us=_borrowed_rate(donor, kind, self.fitted_group))
        raise KeyError(kind)

    def fitted(self, kind: str, members: tuple[int, ...], nbytes: float) -> float:
        """The transfer without the contention factor (what the fitted lines alone say)."""
        return dataclasses.replace(self, contention=1.0).transfer_us(kind, members, nbytes)

    def transfer_us(self, kind: str, members: tuple[int, ...], nbytes: float) -> float:
        if len(members) == 1:
            return 0.0  # a group of one exchanges with itself: a local copy, no wire
        fit = self.line(kind, members)
        nbytes *= bus_factor(kind, len(members)) / bus_factor(kind, self.fitted_group)
        nodes = {m // self.ranks_per_node for m in members}
        if self.inter_bytes_per_us is None or len(nodes) == 1:
            return fit.transfer_us(nbytes) * self.contention
        # An all-to-all sends the share addressed to other nodes over the inter-node link; a
        # ring collective's bytes all cross it once the ring leaves the node. Bytes crossing
        # it move no faster than the hosts moved bytes in the capture (gloo on CPU is bound
        # by the cores, not the wire).
        crossing = (1.0 - self.ranks_per_node / len(members)) if kind == "all_to_all" else 1.0
        inter = min(self.inter_bytes_per_us, fit.bytes_per_us)
        return self.contention * (fit.latency_us + nbytes * (1 - crossing) / fit.bytes_per_us
                                  + nbytes * crossing / inter)
