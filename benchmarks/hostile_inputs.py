"""How long the hostile inputs of tests/robustness/test_hostile_classes.py take to analyse,
beside the clean trace they were made from, in one run: the speed goals those tests used to
assert as wall-clock limits (20, 30 and 60 s; issue 50 moved them here as ratios).

    python benchmarks/hostile_inputs.py [--shared ../shared]

Each case is the test's own damage applied to the same public trace: a world size of 1e9 in
`distributedInfo` (set(range(1e9)) once took minutes and all memory), 1 MB process-group and
kernel names, 200,000 overlapping ProfilerSteps; and a 200,000-interval union clipped once per
step of 200,000 (a scan per step would be 4e10 comparisons) against one pass over it. Prints
seconds and the ratio to the clean analysis (to one pass, for the clip); a ratio in the tens
is a regression to look at, one in the thousands is the old quadratic or unbounded code.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_traces import dumps

from recprof.analysis import analyze_paths
from recprof.analysis.executors import InProcess
from recprof.analysis.intervals import IntervalSet

SST = "traces/torchrec_pr1460/trace/sst_long_a2a_optimizer"
NCCL = "traces/hta/nccl_parser_config/nccl_data.json.gz"


def _load(path: Path) -> dict[str, Any]:
    if path.is_dir():
        path = sorted(path.iterdir())[0]
    data = path.read_bytes()
    return orjson.loads(gzip.decompress(data) if path.name.endswith(".gz") else data)


def _seconds(doc: Any, folder: Path) -> float:
    path = folder / "rank0.json"
    path.write_bytes(dumps(doc))
    start = time.perf_counter()
    analyze_paths([path], executor=InProcess())
    return time.perf_counter() - start


def _huge_world(doc: dict[str, Any]) -> dict[str, Any]:
    doc["distributedInfo"]["world_size"] = 10**9
    return doc


def _long_names(doc: dict[str, Any]) -> dict[str, Any]:
    for ev in doc["traceEvents"]:
        if isinstance(ev.get("args"), dict) and "dtype" in ev["args"]:
            ev["args"]["Process Group Name"] = "g" * 1_000_000
    for ev in [e for e in doc["traceEvents"] if e.get("cat") == "kernel"][:20]:
        ev["name"] = ev["name"] + "x" * 1_000_000
    return doc


def _many_steps(doc: dict[str, Any]) -> dict[str, Any]:
    step = next(e for e in doc["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#"))
    doc["traceEvents"].extend({**step, "name": f"ProfilerStep#{i}", "ts": step["ts"] + i * 0.5,
                               "dur": 1e6} for i in range(200_000))
    return doc


def _clip_per_step() -> tuple[float, float]:
    rng = np.random.default_rng(0)
    starts = np.sort(rng.uniform(0, 1e7, 200_000))
    union = IntervalSet.of(starts, starts + rng.uniform(1, 40, starts.size))
    bounds = np.linspace(0, 1e7 + 100, 200_001)
    t = time.perf_counter()
    sum(union.clip(lo, hi).total() for lo, hi in itertools.pairwise(bounds))
    per_step = time.perf_counter() - t
    t = time.perf_counter()
    union.intersect(IntervalSet.span(0, 1e7 + 100)).total()
    return per_step, time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = []
        for source, cases in ((SST, {"world size 1e9": _huge_world,
                                     "200,000 overlapping steps": _many_steps}),
                              (NCCL, {"1 MB names": _long_names})):
            clean = _seconds(_load(args.shared / source), folder)
            rows.append((f"clean {Path(source).name}", clean, 1.0))
            for name, damage in cases.items():
                took = _seconds(damage(_load(args.shared / source)), folder)
                rows.append((name, took, took / clean))
        per_step, once = _clip_per_step()
        rows.append(("clip per step (200k) vs one pass", per_step, per_step / once))
    print(f"{'case':<36}{'seconds':>10}{'ratio':>10}")
    for name, seconds, ratio in rows:
        print(f"{name:<36}{seconds:>10.2f}{ratio:>10.1f}")


if __name__ == "__main__":
    main()
