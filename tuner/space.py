"""The search space: knob choices, which combinations are valid, and the baseline.

A trial's configuration is a plain dict of knob -> value (`Knobs`). Validity is checked here,
before anything runs, so an invalid combination (micro-batches that do not divide the per-rank
batch, HSP groups that do not divide the world) never costs a trainer run. Configurations are
canonicalised (clustering is meaningless with one micro-batch) so that two dicts that would run
the same training compare equal and the second is answered from the study.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recprof.errors import RecprofError

Knobs = dict[str, Any]

QCOMMS = ("fp32", "bf16", "fp16", "fp8")

# The knobs of the trainer contract (docs/team-contracts.md) and the value each takes in the
# synchronous fp32 baseline that every study starts from.
BASELINE: dict[str, Any] = {
    "micro_batches": 1,
    "hsp_groups": 1,
    "qcomms": "fp32",
    "reshape": 1,
    "dbp": False,
    "clustering": False,
}
# Knobs that change the numbers the model trains on; only these are held to the quality bound.
LOSSY = ("qcomms", "reshape")
# Contract knobs that are off the default space but may be searched from a space file.
OPTIONAL_CONTRACT_KNOBS = ("sharding", "fuse_tables")


def divisors(n: int) -> list[int]:
    """All positive divisors of `n`, ascending (the valid HSP group counts for world `n`)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def is_lossy(knobs: Mapping[str, Any]) -> bool:
    """Whether a configuration departs from fp32 full-dim embeddings (quality can change)."""
    return knobs.get("qcomms", "fp32") != "fp32" or int(knobs.get("reshape", 1)) != 1


def knobs_key(knobs: Mapping[str, Any]) -> str:
    """A stable string identity for a canonical configuration (dedup and storage)."""
    return json.dumps(dict(sorted(knobs.items())), sort_keys=True, separators=(",", ":"))


_SHORT_NAMES = {"micro_batches": "N", "hsp_groups": "M", "qcomms": "q", "reshape": "k"}


def knobs_label(knobs: Mapping[str, Any]) -> str:
    """A compact one-line config, e.g. `N=2 M=1 q=bf16 k=1 dbp clustering`."""
    parts = []
    for name, value in knobs.items():
        if isinstance(value, bool):
            if value:
                parts.append(name)
        else:
            parts.append(f"{_SHORT_NAMES.get(name, name)}={value}")
    return " ".join(parts)


@dataclass(frozen=True)
class JobShape:
    """What validity depends on: the world size and the sizes read from the base config."""

    world_size: int
    global_batch: int | None = None
    embedding_dim: int | None = None

    @property
    def per_rank_batch(self) -> int | None:
        """Samples per rank per step, or None when the base config does not say."""
        if self.global_batch is None:
            return None
        return self.global_batch // self.world_size


@dataclass
class SearchSpace:
    """Ordered choices per knob, plus configurations to try right after the baseline.

    A knob with a single choice is fixed: it is not suggested to the sampler, so it adds no
    dimension to the search.
    """

    choices: dict[str, list[Any]]
    enqueue: list[Knobs] = field(default_factory=list)

    def baseline(self, base_config: Mapping[str, Any]) -> Knobs:
        """The synchronous fp32 baseline; other searched keys keep the base config's value."""
        knobs: Knobs = {}
        for name, options in self.choices.items():
            if name in BASELINE:
                knobs[name] = BASELINE[name]
            elif name in base_config:
                knobs[name] = base_config[name]
            else:
                knobs[name] = options[0]
        return canonical(knobs)

    def searched(self) -> list[str]:
        """Knobs with more than one choice (before any pruning)."""
        return [k for k, v in self.choices.items() if len(v) > 1]

    def grid(self, shape: JobShape) -> Iterator[Knobs]:
        """Every valid canonical configuration, once each (for exhaustion checks and baselines)."""
        names = list(self.choices)
        seen: set[str] = set()
        for values in itertools.product(*(self.choices[n] for n in names)):
            knobs = canonical(dict(zip(names, values, strict=True)))
            key = knobs_key(knobs)
            if key in seen or invalid_reason(knobs, shape) is not None:
                continue
            seen.add(key)
            yield knobs


def canonical(knobs: Mapping[str, Any]) -> Knobs:
    """Rewrite values that cannot change the run to one representative.

    Clustering regroups samples across micro-batches, so with one micro-batch it does nothing.
    """
    out = dict(knobs)
    if int(out.get("micro_batches", 1)) == 1 and "clustering" in out:
        out["clustering"] = False
    return out


def invalid_reason(knobs: Mapping[str, Any], shape: JobShape) -> str | None:
    """Why this configuration cannot run on this job shape, or None when it can."""
    groups = int(knobs.get("hsp_groups", 1))
    if groups < 1 or shape.world_size % groups:
        return f"hsp_groups={groups} does not divide the world size {shape.world_size}"
    micro = int(knobs.get("micro_batches", 1))
    per_rank = shape.per_rank_batch
    if micro < 1:
        return f"micro_batches={micro} must be at least 1"
    if per_rank is not None and per_rank % micro:
        return f"micro_batches={micro} does not divide the per-rank batch {per_rank}"
    k = int(knobs.get("reshape", 1))
    if shape.embedding_dim is not None and (k < 1 or shape.embedding_dim % k):
        return f"reshape={k} does not divide the embedding dim {shape.embedding_dim}"
    if knobs.get("qcomms", "fp32") not in QCOMMS:
        return f"qcomms={knobs.get('qcomms')!r} is not one of {', '.join(QCOMMS)}"
    return None


def default_space(shape: JobShape) -> SearchSpace:
    """The issue's default space, with choices that are invalid on their own removed up front."""
    per_rank = shape.per_rank_batch
    micro = [m for m in (1, 2, 4, 8) if per_rank is None or per_rank % m == 0]
    reshape = [k for k in (1, 2, 4) if shape.embedding_dim is None or shape.embedding_dim % k == 0]
    return SearchSpace(
        choices={
            "micro_batches": micro,
            "hsp_groups": divisors(shape.world_size),
            "qcomms": list(QCOMMS),
            "reshape": reshape,
            "dbp": [False, True],
            "clustering": [False, True],
        }
    )


def load_space(path: Path | None, shape: JobShape) -> SearchSpace:
    """The default space, with knobs overridden by a YAML file when one is given.

    File format::

        knobs:                     # each listed knob replaces the default choices
          micro_batches: [1, 2, 4]
          hsp_groups: auto         # divisors of the world size
          qcomms: [fp32, bf16]
          fuse_tables: [false, true]   # any trainer config key may be searched
          reshape: [1]             # one value: fixed, not searched
        enqueue:                   # tried right after the baseline (partial configs allowed)
          - {micro_batches: 4, dbp: true}
    """
    space = default_space(shape)
    if path is None:
        return space
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise RecprofError(f"{path}: search space file not found") from None
    except yaml.YAMLError as exc:
        raise RecprofError(f"{path}: not valid YAML ({exc})") from None
    if raw is None:
        return space
    if not isinstance(raw, dict) or set(raw) - {"knobs", "enqueue"}:
        raise RecprofError(f"{path}: expected a mapping with keys 'knobs' and/or 'enqueue'")
    knobs = raw.get("knobs") or {}
    if not isinstance(knobs, dict):
        raise RecprofError(f"{path}: 'knobs' must map knob names to lists of values")
    for name, values in knobs.items():
        space.choices[str(name)] = _parse_choices(path, str(name), values, shape)
    enqueue = raw.get("enqueue") or []
    if not isinstance(enqueue, list) or not all(isinstance(e, dict) for e in enqueue):
        raise RecprofError(f"{path}: 'enqueue' must be a list of mappings")
    for entry in enqueue:
        unknown = set(entry) - set(space.choices)
        if unknown:
            raise RecprofError(f"{path}: enqueue names knobs not in the space: {sorted(unknown)}")
        for name, value in entry.items():
            if value not in space.choices[name]:
                raise RecprofError(
                    f"{path}: enqueue value {name}={value!r} is not among its choices "
                    f"{space.choices[name]}"
                )
    space.enqueue = [dict(e) for e in enqueue]
    return space


def _parse_choices(path: Path, name: str, values: Any, shape: JobShape) -> list[Any]:
    """Validate one knob's choices from the space file; `auto` only means something for HSP."""
    if values == "auto" and name == "hsp_groups":
        return divisors(shape.world_size)
    if not isinstance(values, list) or not values:
        raise RecprofError(f"{path}: knob {name!r} needs a non-empty list of values")
    if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
        raise RecprofError(f"{path}: knob {name!r} lists a value twice")
    if not all(isinstance(v, (str, int, float, bool)) for v in values):
        raise RecprofError(f"{path}: knob {name!r} values must be strings, numbers or booleans")
    if name == "qcomms":
        bad = [v for v in values if v not in QCOMMS]
        if bad:
            raise RecprofError(f"{path}: qcomms values {bad} are not among {', '.join(QCOMMS)}")
    if name in ("micro_batches", "hsp_groups", "reshape"):
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise RecprofError(f"{path}: knob {name!r} takes positive integers, got {bad}")
    if name in ("dbp", "clustering", "fuse_tables"):
        bad = [v for v in values if not isinstance(v, bool)]
        if bad:
            raise RecprofError(f"{path}: knob {name!r} takes true/false, got {bad}")
    return list(values)
