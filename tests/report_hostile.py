"""Copies of real traces whose names carry HTML/script payloads, for the hostile-text tests.

Kernel, op, annotation and process-group names are rewritten; everything else (times,
categories, args the analyzer classifies by) is kept, so the copy analyses like the original.
Names the analyzer recognises by their start (NCCL kernels, c10d/gloo/nccl ops, steps,
memcpy) get the payload appended and `ProfilerStep#N` is kept; every other name gets it
prepended, so it survives the report's truncation of long names.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

PAYLOADS = (
    "<script>window.__pwned=1</script>",
    "<img src=x onerror=\"window.__pwned=2;alert(2)\">",
    "\"><svg onload=\"window.__pwned=3\">",
    "</script><script>window.__pwned=4</script>",
    "<!--<a href=\"javascript:window.__pwned=5\">x</a>\u2028\u2029",
)
#: The first payload is the one the tests look for, literally, in the page.
MARKER = PAYLOADS[0]

_KEEP_PREFIX = ("nccl", "c10d", "gloo:", "record_param_comms", "Memcpy",
                "Memset", "##", "cuda", "hip", "Iteration", "PyTorch Profiler")
_NAMED_CATS = {"kernel", "cpu_op", "user_annotation", "gpu_user_annotation", "operator",
               "python_function"}


def _hostile(name: str, i: int) -> str:
    if name.startswith("ProfilerStep#"):  # the step boundaries must stay recognisable
        return name
    payload = PAYLOADS[i % len(PAYLOADS)]
    if name.startswith(_KEEP_PREFIX):
        return name + payload
    return payload + name


def _load(path: Path) -> Any:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def make_hostile_copy(src: Path, dst: Path) -> Path:
    """Write hostile copies of every trace file in folder `src` into `dst`; return `dst`."""
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(p for p in src.iterdir() if p.name.endswith((".json", ".json.gz"))):
        doc = _load(path)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        for i, ev in enumerate(events):
            if str(ev.get("cat", "")).lower() in _NAMED_CATS and isinstance(ev.get("name"), str):
                ev["name"] = _hostile(ev["name"], i)
            args = ev.get("args")
            if isinstance(args, dict):
                for key in ("Process Group Name", "Process Group Description"):
                    if isinstance(args.get(key), str):
                        args[key] = MARKER + args[key]
        info = doc.get("distributedInfo") if isinstance(doc, dict) else None
        for pg in (info or {}).get("pg_config") or []:
            pg["pg_name"] = MARKER + str(pg.get("pg_name", ""))
            pg["pg_desc"] = PAYLOADS[1] + str(pg.get("pg_desc", ""))
        out = dst / path.name.removesuffix(".gz")
        out.write_text(json.dumps(doc), encoding="utf-8")
    return dst
