"""The search space: defaults, validity, canonical forms and the space file."""

from __future__ import annotations

from pathlib import Path

import pytest

from recprof.errors import RecprofError
from recprof.nestpipe.knobs import JobShape, canonical, divisors, invalid_reason, knobs_key
from tuner.space import default_space, load_space

SHAPE = JobShape(world_size=4, global_batch=48, embedding_dim=8)  # per-rank batch 12


def test_default_space_keeps_only_values_valid_for_the_job() -> None:
    space = default_space(SHAPE)
    assert space.choices["hsp_groups"] == [1, 2, 4]
    assert space.choices["micro_batches"] == [1, 2, 4]  # 8 does not divide 12
    assert space.choices["qcomms"] == ["fp32", "bf16", "fp16", "fp8"]
    assert space.choices["reshape"] == [1, 2, 4]
    assert divisors(6) == [1, 2, 3, 6]


def test_invalid_combinations_are_named() -> None:
    base = {"micro_batches": 1, "hsp_groups": 1, "qcomms": "fp32", "reshape": 1}
    assert invalid_reason(base, SHAPE) is None
    assert "does not divide the world size 4" in invalid_reason(base | {"hsp_groups": 3}, SHAPE)
    assert "per-rank batch 12" in invalid_reason(base | {"micro_batches": 8}, SHAPE)
    assert "embedding dim 8" in invalid_reason(base | {"reshape": 3}, SHAPE)


def test_clustering_without_micro_batches_is_the_same_config() -> None:
    a = canonical({"micro_batches": 1, "clustering": True})
    b = canonical({"micro_batches": 1, "clustering": False})
    assert knobs_key(a) == knobs_key(b)
    assert canonical({"micro_batches": 2, "clustering": True})["clustering"] is True


def test_grid_lists_each_valid_config_once() -> None:
    grid = list(default_space(SHAPE).grid(SHAPE))
    keys = {knobs_key(k) for k in grid}
    assert len(keys) == len(grid)
    # (N=1: 1 clustering value + N=2,4: 2 values) x M 3 x q 4 x k 3 x dbp 2
    assert len(grid) == (1 + 2 * 2) * 3 * 4 * 3 * 2
    assert all(invalid_reason(k, SHAPE) is None for k in grid)


def test_space_file_overrides_and_enqueues(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(
        "knobs:\n  qcomms: [fp32, bf16]\n  hsp_groups: auto\n  fuse_tables: [true, false]\n"
        "  reshape: [1]\nenqueue:\n  - {qcomms: bf16}\n"
    )
    space = load_space(path, SHAPE)
    assert space.choices["qcomms"] == ["fp32", "bf16"]
    assert space.choices["fuse_tables"] == [True, False]
    assert space.searched() == [
        "micro_batches", "hsp_groups", "qcomms", "dbp", "clustering", "fuse_tables"
    ]  # fmt: skip
    assert space.enqueue == [{"qcomms": "bf16"}]
    assert space.baseline({"fuse_tables": False})["fuse_tables"] is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("knobs:\n  qcomms: [fp32, int4]\n", "not among"),
        ("knobs:\n  micro_batches: [0, 2]\n", "positive integers"),
        ("knobs:\n  dbp: [yes_please]\n", "true/false"),
        ("knobs:\n  reshape: []\n", "non-empty list"),
        ("enqueue:\n  - {nope: 1}\n", "not in the space"),
        ("knobs: [1, 2]\n", "'knobs' must map"),
        ("other: 1\n", "expected a mapping"),
        ("knobs: {a: [1, 1]}\n", "twice"),
    ],
)
def test_bad_space_files_are_user_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(RecprofError, match=message):
        load_space(path, SHAPE)
