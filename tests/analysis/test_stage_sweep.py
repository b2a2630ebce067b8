"""The stage sweep (`stages._innermost`) against a brute-force reading of the labels.

Labels of non-main threads share one sweep, so they interleave instead of nesting: a label
that closed can sit under one still open. The sweep must never attribute to it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from recprof.analysis.stages import _innermost
from recprof.trace.model import LabelSpans

spans = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 15), st.integers(-1, 3),
                           st.integers(-1, 3)), min_size=1, max_size=12)


def _brute_force(labels: LabelSpans, times: list[int]) -> tuple[list[int], list[int]]:
    """Per time: of the labels open at it, in (start, longest first) order, the last one
    naming a stage and the last one naming a purpose."""
    order = sorted(range(len(labels)), key=lambda j: (labels.start[j], -labels.end[j]))
    stage, purpose = [], []
    for t in times:
        open_ = [j for j in order if labels.start[j] <= t <= labels.end[j]]
        stage.append(next((int(labels.stage[j]) for j in reversed(open_)
                           if labels.stage[j] >= 0), -1))
        purpose.append(next((int(labels.purpose[j]) for j in reversed(open_)
                             if labels.purpose[j] >= 0), -1))
    return stage, purpose


@settings(max_examples=300, deadline=None)
@given(spans, st.lists(st.integers(0, 60), min_size=1, max_size=20))
def test_sweep_matches_brute_force(raw: list[tuple[int, int, int, int]],
                                   times: list[int]) -> None:
    labels = LabelSpans(
        start=np.array([s for s, _, _, _ in raw], dtype=float),
        end=np.array([s + d for s, d, _, _ in raw], dtype=float),
        stage=np.array([st_ for _, _, st_, _ in raw], dtype=np.int16),
        purpose=np.array([p for _, _, _, p in raw], dtype=np.int16),
        main_thread=np.zeros(len(raw), dtype=bool))
    stage, purpose = _innermost(labels, np.arange(len(raw)), np.array(times, dtype=float))
    assert (stage.tolist(), purpose.tolist()) == _brute_force(labels, times)


def test_a_closed_label_under_an_open_one_is_not_used() -> None:
    # Thread A's [0, 50] names a stage, thread B's [1, 10] a purpose, thread A's [2, 60] nothing.
    # At t=20 B's label has closed but sits under [2, 60], still open: no purpose there.
    labels = LabelSpans(start=np.array([0.0, 1.0, 2.0]), end=np.array([50.0, 10.0, 60.0]),
                        stage=np.array([2, -1, -1], dtype=np.int16),
                        purpose=np.array([-1, 4, -1], dtype=np.int16),
                        main_thread=np.zeros(3, dtype=bool))
    stage, purpose = _innermost(labels, np.arange(3), np.array([5.0, 20.0]))
    assert stage.tolist() == [2, 2]
    assert purpose.tolist() == [4, -1]
