"""The what-if's traffic (recprof/nestpipe/traffic.py) is the trainer's own: for several knob
settings, each collective's bytes per rank per step that `traffic()` counts from the job's keys
equal what the trainer handed to that collective in a real 2-rank run (torchrun, gloo).

The trainer's numbers are its own byte counter (`ShardedEmbeddings._count`, logged per call
by batch_entry.py with the rows sent to each peer): the sum over ranks of what each sent to the
others is checked to be its summary's `bytes_per_step`, then the same calls in the analyzer's
convention (a rank's message is the larger of what it sends and what it receives, its own part
included: trace/vocabulary.message_bytes), which is traffic's, are compared with traffic's
counts, averaged over the same batches (traffic samples `SAMPLED_BATCHES` from batch 0; the
trainer's step i trains batch i). The keys are a pure function of the config, so both sides
count the same rows: the match is exact.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from nestpipe_runs import CPU, TINY, Run, Runs
from nestpipe_runs import VARIANTS as VARIANTS_SETS

from recprof.nestpipe.config import load_config
from recprof.nestpipe.traffic import SAMPLED_BATCHES, traffic, wire_bytes

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

#: The knob settings compared: the float32 baseline, two wire formats, reshape and micro-batches
#: (nestpipe_runs.VARIANTS; runs the distributed tests launch anyway). Measured 2026-11-28:
#: all equal to the byte (rel 1e-12); unfused tables too since traffic counts one exchange per
#: table (before, one over all tables: rank 0's forward rows 8,048 B against the trainer's 8,384).
VARIANTS = ["fp32", "bf16", "fp8", "reshape2", "fwp2"]
WORLD = 2
#: The trainer's counter kinds for what traffic counts.
KINDS = ("key_a2a", "embedding_a2a_fwd", "grad_a2a_bwd")


def _calls(run: Run) -> dict[int, list[dict]]:
    return {r: json.loads((run.out / f"counts.rank{r}.json").read_text()) for r in range(WORLD)}


def _sent_to_others(run: Run) -> dict[str, float]:
    """Per kind, bytes per training step that all ranks together sent to other ranks."""
    total: dict[str, float] = defaultdict(float)
    steps = run.summary["config"]["steps"]
    for r, calls in _calls(run).items():
        for c in calls:
            if c["step"] >= 0:
                total[c["kind"]] += c["row_bytes"] * (sum(c["counts"]) - c["counts"][r])
    return {k: v / steps for k, v in total.items()}


def _messages(run: Run, steps: range) -> dict[int, dict[str, float]]:
    """Per rank and kind, the bytes of its messages per step over `steps` in the analyzer's
    convention: per call, max(sent, received), its own rows included. Every rank makes the
    same calls in the same order (collectives), so the n-th call of a step on each rank is one
    collective."""
    calls = _calls(run)
    out: dict[int, dict[str, float]] = {r: defaultdict(float) for r in range(WORLD)}
    for step in steps:
        per_rank = {r: [c for c in cs if c["step"] == step] for r, cs in calls.items()}
        assert len({len(v) for v in per_rank.values()}) == 1
        for same in zip(*per_rank.values(), strict=True):
            assert len({(c["kind"], len(c["counts"])) for c in same}) == 1
            for r, c in enumerate(same):
                received = sum(other["counts"][r] for other in same)
                out[r][c["kind"]] += c["row_bytes"] * max(sum(c["counts"]), received)
    return {r: {k: v / len(steps) for k, v in kinds.items()} for r, kinds in out.items()}


@pytest.mark.parametrize("variant", [*VARIANTS, "fwp4_clustered"])
def test_traffic_bytes_are_the_trainers(runs: Runs, variant: str) -> None:
    run = runs[variant]
    # the logged calls are the trainer's summary, to the byte
    summary = run.summary["bytes_per_step"]
    sent = _sent_to_others(run)
    for kind in KINDS:
        assert sent.get(kind, 0.0) == pytest.approx(summary[kind], rel=1e-12), kind
    assert summary["embedding_a2a_fwd"] > 0  # two ranks really exchange rows
    cfg = load_config(TINY, [*VARIANTS_SETS[variant][1], CPU])  # as nestpipe_runs ran it
    fwd_row, bwd_row, _ = wire_bytes(cfg)
    predicted = traffic(cfg, WORLD, first_batch=0)
    assert predicted.batches == SAMPLED_BATCHES <= cfg.steps
    measured = _messages(run, range(SAMPLED_BATCHES))
    for r, tr in predicted.ranks.items():
        assert sum(tr.key_routing) == pytest.approx(measured[r]["key_a2a"], rel=1e-12), r
        assert sum(tr.rows_fwd) * fwd_row == pytest.approx(
            measured[r]["embedding_a2a_fwd"], rel=1e-12), r
        assert sum(tr.rows_bwd) * bwd_row == pytest.approx(
            measured[r]["grad_a2a_bwd"], rel=1e-12), r
        assert len(tr.rows_fwd) == cfg.micro_batches

