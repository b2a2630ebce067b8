"""The knob registry is the one source of validity: the trainer's config validation and the
tuner accept exactly the same configurations, on the default grid and on random job shapes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recprof.errors import RecprofError
from recprof.nestpipe.config import TrainConfig, load_config, validate
from recprof.nestpipe.knobs import KNOBS, JobShape, invalid_reason, knobs_label
from tuner.space import default_space


def trainer_accepts(knobs: dict, shape: JobShape) -> bool:
    """Whether `python -m recprof.nestpipe` would start with these knobs on this shape."""
    sets = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in knobs.items()]
    sets += [f"batch_size={shape.global_batch}", f"embedding_dim={shape.embedding_dim}"]
    try:
        validate(load_config(None, sets), shape.world_size)
    except RecprofError:
        return False
    return True


def test_every_default_grid_config_runs_on_the_trainer() -> None:
    shape = JobShape(world_size=4, global_batch=48, embedding_dim=8)
    grid = list(default_space(shape).grid(shape))
    assert len(grid) > 100
    rejected = [knobs_label(k) for k in grid if not trainer_accepts(k, shape)]
    assert rejected == []


@settings(max_examples=60, deadline=None)
@given(
    world=st.integers(1, 8),
    per_rank=st.integers(1, 40),
    dim=st.sampled_from([4, 6, 8, 12, 16]),
    micro=st.integers(0, 12),
    hsp=st.integers(1, 9),
    reshape=st.integers(1, 6),
    qcomms=st.sampled_from(["fp32", "bf16", "fp16", "fp8", "int4"]),
)
def test_trainer_and_tuner_agree_on_random_shapes(world: int, per_rank: int, dim: int,
                                                  micro: int, hsp: int, reshape: int,
                                                  qcomms: str) -> None:
    shape = JobShape(world_size=world, global_batch=world * per_rank, embedding_dim=dim)
    knobs = {"micro_batches": micro, "hsp_groups": hsp, "reshape": reshape, "qcomms": qcomms}
    tuner_ok = invalid_reason(knobs, shape) is None
    assert trainer_accepts(knobs, shape) == tuner_ok, (knobs, shape, invalid_reason(knobs, shape))


def test_the_disagreement_of_record_is_gone() -> None:
    """micro_batches=5 on a per-rank batch of 12: refused by both, with the same rule."""
    shape = JobShape(world_size=2, global_batch=24, embedding_dim=16)
    assert invalid_reason({"micro_batches": 5}, shape) == (
        "micro_batches=5 does not divide the per-rank batch 12")
    with pytest.raises(RecprofError, match=r"^micro_batches: must divide the per-rank batch"):
        validate(load_config(None, ["micro_batches=5", "batch_size=24"]), 2)


def test_every_knob_is_a_trainer_config_key_with_its_baseline_default() -> None:
    defaults = TrainConfig()
    for name, knob in KNOBS.items():
        assert getattr(defaults, name) == knob.baseline
        assert isinstance(knob.baseline, knob.kind)
    for name in ("micro_batches", "qcomms", "dbp"):
        assert list(itertools.islice(KNOBS[name].default_choices(
            JobShape(2, 64, 16)), 1)) == [KNOBS[name].baseline]
