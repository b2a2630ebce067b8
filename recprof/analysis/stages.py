"""Recsys stages of a step, and what each collective carries, from the labels around them.

Every piece of activity (a kernel, a CPU op, a gloo transfer) belongs to the innermost label
of the thread that issued it (its launch: the kernel's launch call, the collective's enqueue)
that names a stage (vocabulary.label_meaning): TorchRec's `## forward N ##` with its
`[lookup]_...` and `[output_dist]_...` inside, the built-in trainer's `nestpipe:*`, DDP's
forward, autograd's backward nodes, the optimizers' steps, the DataLoader. A collective's
purpose is the innermost purpose label around its launch; failing that, it is inferred from
what the trace shows around it (`Attribution.inferred` says which):

- an all-reduce during backward carries dense gradients, an all-to-all there embedding
  gradients;
- an all-to-all in the forward pass that no label explains moves sparse data: the keys when its
  payload is integer, the embedding rows otherwise (older TorchRec traces label only the KJT
  all-to-alls; the pooled embeddings' all-to-all under `# running sparse arch` is the rest);
- hand-written model-parallel jobs label nothing, but their lookups are plain in the trace
  (nn.Embedding / nn.EmbeddingBag ops, EmbeddingBag kernels: the embedding-lookup stage). An
  all-to-all of the forward pass that moves floating-point data after the step's lookups
  began carries their output, the embedding rows, to the ranks that asked (it comes before
  the dense forward that reads them: the step's forward runs in order on its thread); one that
  moves integers (ids and their counts) routes the keys to the rows' owners.

Its stage follows its purpose (vocabulary.PURPOSE_STAGE).

Per step, a stage's time is the union of its activity (plus, for data loading, the host's time
in the loader on any thread: the device waits then, with nothing of its own to show), and its
exposed part is what no other stage's compute overlaps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import SkewAnalysis, StageTime
from recprof.analysis.windows import Window
from recprof.trace.model import ActivityClass, LabelSpans, RankTrace
from recprof.trace.vocabulary import (
    COLLECTIVE_KINDS,
    PURPOSE_STAGE,
    PURPOSES,
    STAGES,
    is_lookup_kernel,
)

_OTHER = STAGES.index("other")
_BACKWARD = STAGES.index("dense_backward")
_FORWARD = STAGES.index("dense_forward")
_EMBEDDING_A2A = STAGES.index("embedding_a2a")
_DATA = STAGES.index("data_loading")
_LOOKUP = STAGES.index("embedding_lookup")
_STAGE_OF_PURPOSE = {PURPOSES.index(p): STAGES.index(s) for p, s in PURPOSE_STAGE.items()}
_UNKNOWN = PURPOSES.index("unknown")
_ALL_REDUCE = COLLECTIVE_KINDS.index("all_reduce")
_ALL_TO_ALL = COLLECTIVE_KINDS.index("all_to_all")
_DENSE_GRADS = PURPOSES.index("dense_grads")
_GRADS_BWD = PURPOSES.index("embedding_grads_bwd")
_ROWS_FWD = PURPOSES.index("embedding_rows_fwd")
_PREFETCH = PURPOSES.index("prefetch")
_KEY_ROUTING = PURPOSES.index("key_routing")


@dataclass
class Attribution:
    """Per activity of a rank: its stage and, for a collective instance, its purpose."""

    stage: np.ndarray  # index into STAGES
    purpose: np.ndarray  # index into PURPOSES; -1 for what is not a collective instance
    #: A collective whose purpose was inferred from the trace, not read from a label.
    inferred: np.ndarray


def _innermost(labels: LabelSpans, rows: np.ndarray, times: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """For each time, the stage of the innermost label in `rows` open at it (-1 if none) and
    the purpose of the innermost one that names a purpose (-1 if none). The innermost is the
    one that started last (the shorter at equal starts) among those open at the time, whether
    or not the labels of several threads interleave."""
    order = rows[np.lexsort((-labels.end[rows], labels.start[rows]))]
    stage = _last_open(labels.start[order], labels.end[order], labels.stage[order], times)
    purpose = _last_open(labels.start[order], labels.end[order], labels.purpose[order], times)
    return stage.astype(np.int16), purpose.astype(np.int16)


def _last_open(starts: np.ndarray, ends: np.ndarray, values: np.ndarray, times: np.ndarray
               ) -> np.ndarray:
    """Per time, the value of the last span (in the given order, by start) among those with a
    value (>= 0) open at it, or -1. The last span started by then is found by bisection; from
    it back, the last one still open is found by binary lifting over a table of the spans'
    latest ends per power-of-two block, all times at once."""
    keep = values >= 0
    starts, ends, values = starts[keep], ends[keep], values[keep]
    out = np.full(len(times), -1, dtype=np.int64)
    if not starts.size or not len(times):
        return out
    pos = np.searchsorted(starts, times, side="right") - 1
    # latest[p][i]: the latest end among spans i - 2^p + 1 .. i
    latest = [ends]
    while (1 << len(latest)) <= starts.size:
        step = 1 << (len(latest) - 1)
        prev = latest[-1]
        latest.append(np.concatenate([prev[:step], np.maximum(prev[step:], prev[:-step])]))
    for power in range(len(latest) - 1, -1, -1):
        block = 1 << power
        skip = (pos - block + 1 >= 0) & (latest[power][np.maximum(pos, 0)] < times)
        pos = np.where(skip, pos - block, pos)
    found = (pos >= 0) & (ends[np.maximum(pos, 0)] >= times)
    out[found] = values[pos[found]]
    return out


def attribute(trace: RankTrace) -> Attribution:
    """The stage of every activity of a rank and the purpose of every collective instance."""
    acts = trace.activities
    n = len(acts)
    stage = np.full(n, _OTHER, dtype=np.int16)
    purpose = np.full(n, -1, dtype=np.int16)
    labels = trace.labels
    times = np.where(np.isnan(acts.launch), acts.start, acts.launch)
    if labels is not None and len(labels) and n:
        for on_main in (True, False):
            sel = np.flatnonzero(acts.launched_on_main == on_main)
            rows = np.flatnonzero(labels.main_thread == on_main)
            if not sel.size or not rows.size:
                continue
            s, p = _innermost(labels, rows, times[sel])
            stage[sel] = np.where(s >= 0, s, _OTHER)
            purpose[sel] = p
    coll = acts.coll_kind >= 0
    # Lookups no label placed: work issued inside a lookup op (a hand-written job's
    # nn.EmbeddingBag), lookup kernels whose op the trace lacks.
    if n:
        lookup = np.fromiter((is_lookup_kernel(trace.names[i]) for i in acts.name), bool, n)
        lookup |= _inside(trace.lookups.start, trace.lookups.end, times)
        stage = np.where(lookup & (stage == _OTHER), _LOOKUP, stage)
    # A collective without a purpose label: what it does inside its stage.
    guess = np.where((stage == _BACKWARD) & (acts.coll_kind == _ALL_REDUCE), _DENSE_GRADS,
                     np.where((stage == _BACKWARD) & (acts.coll_kind == _ALL_TO_ALL), _GRADS_BWD,
                              _UNKNOWN))
    guess = np.where((guess == _UNKNOWN) & (acts.coll_kind == _ALL_TO_ALL) & (stage != _BACKWARD),
                     _forward_exchange(trace, stage, times), guess)
    # An all-to-all under a forward label that nothing else explains moves sparse data, not
    # dense compute (older TorchRec labels only the KJT parts): keys when its payload is
    # integer, the embeddings otherwise. Its stage follows from this purpose below, so the
    # stage table and the collectives table say the same of it.
    guess = np.where((guess == _UNKNOWN) & (stage == _FORWARD) & (acts.coll_kind == _ALL_TO_ALL),
                     np.where(acts.coll_floating == 0, _KEY_ROUTING, _ROWS_FWD), guess)
    inferred = coll & (purpose < 0) & (guess != _UNKNOWN)
    purpose = np.where(coll & (purpose < 0), guess, purpose)
    # The next batch's rows fetched on the built-in trainer's prefetch thread (DBP).
    purpose = np.where(coll & (purpose == _ROWS_FWD) & ~acts.launched_on_main, _PREFETCH, purpose)
    purpose = np.where(coll, purpose, -1)
    for p, s in _STAGE_OF_PURPOSE.items():
        stage = np.where(coll & (purpose == p), s, stage)
    return Attribution(stage.astype(np.int16), purpose.astype(np.int16), inferred)


def _inside(starts: np.ndarray, ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Which times fall inside one of the spans (their union: spans may nest)."""
    union = IntervalSet.of(starts, ends)
    if not len(union):
        return np.zeros(len(times), dtype=bool)
    k = np.searchsorted(union.starts, times, side="right") - 1
    return (k >= 0) & (times <= union.ends[np.maximum(k, 0)])


def _forward_exchange(trace: RankTrace, stage: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Per activity, what an unlabelled forward all-to-all issued at its time carries, from
    the step's lookups (module doc): embedding rows when it moves floating-point data and the
    step's lookups began before it, the keys when it moves integers; unknown otherwise. The
    lookups are the lookup ops, the embedding-lookup stage's labels and its activity, on any
    thread."""
    acts = trace.activities
    starts = [acts.start[stage == _LOOKUP], trace.lookups.start]
    if trace.labels is not None and len(trace.labels):
        starts.append(trace.labels.start[trace.labels.stage == _LOOKUP])
    lookups = np.sort(np.concatenate(starts))
    out = np.full(len(acts), _UNKNOWN, dtype=np.int16)
    if not lookups.size:
        return out
    # where the step each activity was issued in began (-inf before the first step, or in a
    # trace without steps)
    step_starts = np.concatenate(([-np.inf], np.sort([s.start_us for s in trace.steps])))
    step_start = step_starts[np.searchsorted(step_starts, times, side="right") - 1]
    prior = np.searchsorted(lookups, times, side="left") - 1  # latest lookup before it
    looked_up = (prior >= 0) & (lookups[np.maximum(prior, 0)] >= step_start)
    out[(acts.coll_floating == 1) & looked_up] = _ROWS_FWD
    out[acts.coll_floating == 0] = _KEY_ROUTING
    return out


def stage_times(trace: RankTrace, windows: list[Window],
                attribution: Attribution) -> dict[str, StageTime]:
    """Each stage's mean time and exposed time per step over `windows` (stages with none
    are left out)."""
    acts = trace.activities
    compute = acts.klass == ActivityClass.COMPUTE
    labels = trace.labels
    loading = IntervalSet.empty()
    if labels is not None and len(labels):
        host = labels.stage == _DATA  # any thread: DBP loads on its prefetch thread
        loading = IntervalSet.of(labels.start[host], labels.end[host])
    n = max(len(windows), 1)
    out: dict[str, StageTime] = {}
    for index, name in enumerate(STAGES):
        mine = attribution.stage == index
        spans = IntervalSet.of(acts.start[mine], acts.end[mine])
        if index == _DATA:
            spans = spans.union(loading)
        if not len(spans):
            continue
        others = IntervalSet.of(acts.start[compute & ~mine], acts.end[compute & ~mine])
        time = exposed = 0.0
        for w in windows:
            part = spans.clip(w.start, w.end)
            time += part.total()
            exposed += part.subtract(others).total()
        if time > 0:
            out[name] = StageTime(time_us_per_step=time / n, exposed_us_per_step=exposed / n)
    return out


#: A stage whose collectives spent at least this share of its exposed time waiting for later
#: ranks reads as waiting, not as slow.
MOSTLY_WAITING = 0.5


def waiting_note(stage: StageTime, skew: SkewAnalysis) -> str:
    """What a stage row says when its exposed time is mostly its collectives waiting for later
    ranks (`mostly waiting for rank 2`), else nothing: the row alone would read as a slow
    stage (TorchRec's embedding all-to-all, 759 ms exposed on three ranks that waited for the
    fourth). The rank is the one whose lateness causes the most blocking wait."""
    if stage.exposed_us_per_step <= 0 or (
            stage.waiting_us_per_step < MOSTLY_WAITING * stage.exposed_us_per_step):
        return ""
    caused = skew.caused_blocking_us_per_step_by_rank
    late = skew.straggler_rank if skew.straggler_rank is not None else (
        max(caused, key=lambda r: caused[r]) if caused and max(caused.values()) > 0 else None)
    who = f"rank {late}" if late is not None else "later ranks"
    return f"mostly waiting for {who}"
