"""Config loading and validation: every problem is one line that names the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from nestpipe_runs import REPO, TINY

from recprof.errors import RecprofError
from recprof.nestpipe.config import load_config, validate


def test_file_and_overrides_resolve() -> None:
    cfg = load_config(TINY, ["qcomms=fp8", "fuse_tables=false", "num_embeddings=[5, 6, 7]"])
    assert (cfg.qcomms, cfg.fuse_tables, cfg.num_embeddings) == ("fp8", False, [5, 6, 7])
    assert cfg.steps == 6  # from the file


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('qcomms = "bf16"\nreshape = 2\n')
    cfg = load_config(path)
    assert (cfg.qcomms, cfg.reshape, cfg.dim) == ("bf16", 2, cfg.embedding_dim // 2)
    assert cfg.table_rows() == [n * 2 for n in [cfg.num_embeddings] * cfg.num_tables]


@pytest.mark.parametrize(
    ("sets", "world", "starts"),
    [
        (["qcomms=int4"], 2, "qcomms: must be one of"),
        (["sharding=column"], 2, "sharding: must be one of"),
        (["colour=red"], 2, "colour: unknown config key"),
        (["steps=ten"], 2, "steps: expected an integer"),
        (["fuse_tables=3"], 2, "fuse_tables: expected true or false"),
        (["hsp_groups=3"], 4, "hsp_groups: must divide the world size"),
        (["batch_size=63"], 2, "batch_size: must be a multiple"),
        (["reshape=3"], 1, "reshape: must divide embedding_dim"),
        (["warmup_steps=6"], 1, "warmup_steps: must be < steps"),
        (["num_embeddings=[1, 2]"], 1, "num_embeddings: lists 2 tables"),
        (["dbp=1"], 1, "dbp: expected true or false"),
        (["micro_batches=33"], 2, "micro_batches: must be <= the per-rank batch (32)"),
        (["data=tsv"], 1, "data_path: required"),
        (["noequals"], 1, "--set: expected key=value"),
        (["dtype=float16"], 1, "dtype: must be one of float32|float64, got 'float16'"),
    ],
)
def test_bad_values_name_the_key(sets: list[str], world: int, starts: str) -> None:
    with pytest.raises(RecprofError) as info:
        validate(load_config(TINY, sets), world)
    assert str(info.value).startswith(starts)


def test_dtype_defaults_to_float32() -> None:
    assert load_config(TINY).dtype == "float32"
    assert load_config(TINY, ["dtype=float64"]).dtype == "float64"


def test_missing_file() -> None:
    with pytest.raises(RecprofError, match="config: no such file"):
        load_config(Path("/nonexistent/x.yaml"))


def test_entry_point_prints_one_line_without_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "recprof.nestpipe", "--config", str(TINY), "--set", "qcomms=fp4"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: qcomms: must be one of fp32|bf16|fp16|fp8, got 'fp4'"
    ]
