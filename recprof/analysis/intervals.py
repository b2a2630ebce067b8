"""Interval algebra over sorted, disjoint numpy intervals.

Every breakdown number is a length of a union, intersection or difference of activity, so
these few operations carry the whole analyzer; they are vectorised because a rank can hold
hundreds of thousands of kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class IntervalSet:
    """A union of half-open intervals [start, end), stored sorted and disjoint."""

    starts: np.ndarray
    ends: np.ndarray

    @staticmethod
    def empty() -> IntervalSet:
        return IntervalSet(np.empty(0), np.empty(0))

    @staticmethod
    def of(starts: np.ndarray, ends: np.ndarray) -> IntervalSet:
        """Union of possibly overlapping intervals."""
        starts = np.asarray(starts, dtype=np.float64)
        ends = np.asarray(ends, dtype=np.float64)
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        if starts.size == 0:
            return IntervalSet.empty()
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        running_end = np.maximum.accumulate(ends)
        # A new merged interval begins where the start lies beyond every earlier end.
        new = np.empty(starts.size, dtype=bool)
        new[0] = True
        new[1:] = starts[1:] > running_end[:-1]
        idx = np.flatnonzero(new)
        merged_ends = np.maximum.reduceat(ends, idx)
        return IntervalSet(starts[idx], merged_ends)

    @staticmethod
    def span(start: float, end: float) -> IntervalSet:
        return IntervalSet.of(np.array([start]), np.array([end]))

    def total(self) -> float:
        return float(np.sum(self.ends - self.starts)) if self.starts.size else 0.0

    def __len__(self) -> int:
        return int(self.starts.size)

    def union(self, other: IntervalSet) -> IntervalSet:
        return IntervalSet.of(np.concatenate([self.starts, other.starts]),
                              np.concatenate([self.ends, other.ends]))

    def intersect(self, other: IntervalSet) -> IntervalSet:
        if not len(self) or not len(other):
            return IntervalSet.empty()
        # For each interval of self, the candidate overlapping intervals of other.
        lo = np.searchsorted(other.ends, self.starts, side="right")
        hi = np.searchsorted(other.starts, self.ends, side="left")
        counts = np.maximum(hi - lo, 0)
        if not counts.sum():
            return IntervalSet.empty()
        owner = np.repeat(np.arange(len(self)), counts)
        offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        partner = np.repeat(lo, counts) + offsets
        starts = np.maximum(self.starts[owner], other.starts[partner])
        ends = np.minimum(self.ends[owner], other.ends[partner])
        keep = ends > starts
        return IntervalSet(starts[keep], ends[keep])

    def complement_within(self, start: float, end: float) -> IntervalSet:
        """The gaps of this set inside [start, end)."""
        clipped = self.clip(start, end)
        gap_starts = np.concatenate([[start], clipped.ends])
        gap_ends = np.concatenate([clipped.starts, [end]])
        keep = gap_ends > gap_starts
        return IntervalSet(gap_starts[keep], gap_ends[keep])

    def subtract(self, other: IntervalSet) -> IntervalSet:
        if not len(self) or not len(other):
            return self
        lo, hi = float(self.starts[0]), float(self.ends[-1])
        if len(self) == 1:  # the gaps of `other` inside the one interval, exactly as below
            return other.complement_within(lo, hi)
        return self.intersect(other.complement_within(lo, hi))

    def clip(self, start: float, end: float) -> IntervalSet:
        """The part inside [start, end). Found by bisection, not by intersecting with a span:
        a rank with many steps clips its unions once per step, and a scan each time made
        200,000 steps quadratic."""
        lo = int(np.searchsorted(self.ends, start, side="right"))
        hi = int(np.searchsorted(self.starts, end, side="left"))
        if hi <= lo:
            return IntervalSet.empty()
        starts, ends = self.starts[lo:hi].copy(), self.ends[lo:hi].copy()
        starts[0] = max(starts[0], start)
        ends[-1] = min(ends[-1], end)
        keep = ends > starts
        return IntervalSet(starts[keep], ends[keep])

    def covered_before(self, t: np.ndarray) -> np.ndarray:
        """For each time in `t`, how much of this set lies before it (vectorised)."""
        t = np.asarray(t, dtype=np.float64)
        if not len(self):
            return np.zeros_like(t)
        lengths = self.ends - self.starts
        before = np.concatenate([[0.0], np.cumsum(lengths)])  # covered before interval k
        k = np.searchsorted(self.starts, t, side="right") - 1
        inside = np.clip(np.minimum(t, self.ends[np.maximum(k, 0)])
                         - self.starts[np.maximum(k, 0)], 0.0, None)
        return np.where(k >= 0, before[np.maximum(k, 0)] + inside, 0.0)

    def covered(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """For each [lo, hi), how much of it this set covers (vectorised)."""
        return np.maximum(self.covered_before(hi) - self.covered_before(lo), 0.0)
