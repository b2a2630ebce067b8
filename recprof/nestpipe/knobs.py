"""The built-in trainer's knobs, each declared once: what it is, what values it takes on a job
shape, its baseline, whether it is lossy, what it acts on, and when it is invalid.

Everything that needs a knob fact reads it here: the trainer's config (its fields and their
validation), the tuner (search space, baseline, lossy bound, pruning, labels) and the analysis'
findings (which knobs to name, whether `recprof tune` searches them by default). Optuna's
distributions are the model: a knob is declared once and every consumer asks the declaration.
No torch import: the analyzer and the tuner read this without the trainer.

Adding a knob: one `Knob(...)` in `KNOBS` (plus a `_rules` entry if some values are invalid on
some job shapes), the code that implements it, a test, and the two docs (docs/nestpipe.md's
knob table, docs/tuner.md's space).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Knobs = dict[str, Any]

#: What a knob changes, for the tuner's pruning and the findings that name it.
BYTES = "bytes"  # fewer bytes on the wire
OVERLAP = "overlap"  # hides communication or copies behind compute
BALANCE = "balance"  # evens out the work between ranks
LAUNCH = "launch"  # fewer, larger operations

QCOMMS = ("fp32", "bf16", "fp16", "fp8")
SHARDING = ("row", "table")
#: Routed keys carry the micro-batch index in 7 bits (embedding.py).
MAX_MICRO_BATCHES = 128


@dataclass(frozen=True)
class JobShape:
    """What a knob's validity depends on: the world size and the sizes of the job."""

    world_size: int
    global_batch: int | None = None
    embedding_dim: int | None = None
    #: Consecutive samples a micro-batch keeps together (a two-tower model's softmax group).
    sample_group: int = 1

    @property
    def per_rank_batch(self) -> int | None:
        """Samples per rank per step, or None when the batch size is not known."""
        if self.global_batch is None:
            return None
        return self.global_batch // self.world_size


@dataclass(frozen=True)
class Knob:
    """One knob of the trainer contract (docs/team-contracts.md)."""

    name: str
    kind: type  # int, bool or str: the type of its value in a config file
    baseline: Any  # the synchronous fp32 baseline's value, and the trainer's default
    short: str  # compact label in the tuner's progress lines and tables
    acts_on: frozenset[str]
    lossy: bool  # changes the numbers the model trains on (held to the quality bound)
    searched: bool  # in `recprof tune`'s default space
    description: str
    #: Default search choices on a job shape (searched knobs only).
    choices: Callable[[JobShape], list[Any]] | None = None
    #: The values a config file may hold (str knobs); anything else is invalid everywhere.
    allowed: tuple[str, ...] = ()

    def default_choices(self, shape: JobShape) -> list[Any]:
        """The choices `recprof tune` searches on this shape, invalid ones already removed."""
        if self.choices is None:
            return [self.baseline]
        candidates = self.choices(shape)
        return [v for v in candidates if not problems({self.name: v}, shape)]


def divisors(n: int) -> list[int]:
    """All positive divisors of `n`, ascending (the valid HSP group counts for world `n`)."""
    return [d for d in range(1, n + 1) if n % d == 0]


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("micro_batches", int, 1, "N", frozenset({OVERLAP}), False, True,
         "frozen-window pipelining (FWP): split each rank's batch into N micro-batches whose "
         "embedding all-to-alls overlap the dense compute of their neighbours",
         choices=lambda shape: [1, 2, 4, 8]),
    Knob("hsp_groups", int, 1, "M", frozenset({BYTES}), False, True,
         "hierarchical sharding (HSP): M groups, each a full replica sharded inside the group, "
         "so the all-to-all stays inside a group and gradients are all-reduced across groups",
         choices=lambda shape: divisors(shape.world_size)),
    Knob("qcomms", str, "fp32", "q", frozenset({BYTES}), True, True,
         "wire precision of the embedding all-to-all, forward and backward",
         choices=lambda shape: list(QCOMMS), allowed=QCOMMS),
    Knob("reshape", int, 1, "k", frozenset({BYTES}), True, True,
         "embedding reshape: dim / k with rows x k (same capacity, fewer bytes per lookup)",
         choices=lambda shape: [1, 2, 4]),
    Knob("dbp", bool, False, "dbp", frozenset({OVERLAP}), False, True,
         "dual-buffer pipelining (DBP): the next batch is loaded, routed and its rows fetched "
         "while this batch computes (on a copy stream on GPUs)",
         choices=lambda shape: [False, True]),
    Knob("clustering", bool, False, "clustering", frozenset({OVERLAP}), False, True,
         "key-centric sample clustering across micro-batches (needs micro_batches > 1)",
         choices=lambda shape: [False, True]),
    Knob("sharding", str, "row", "sharding", frozenset({BALANCE}), False, False,
         "row-wise (balanced by hash) or table-wise embedding sharding", allowed=SHARDING),
    Knob("fuse_tables", bool, True, "fuse_tables", frozenset({LAUNCH}), False, False,
         "one all-to-all per embedding dimension instead of one per table"),
)}


# --- validity --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """Why one knob value cannot run on a job shape, in the two moods its readers need: the
    trainer's config error (`must ...`) and the tuner's description of a trial (`... does not`).
    """

    key: str
    value: Any
    must: str  # "must divide the world size (4)"
    fails: str  # "does not divide the world size 4"

    def config_error(self) -> str:
        """`hsp_groups: must divide the world size (4), got 3` (the trainer's one line)."""
        return f"{self.key}: {self.must}, got {self.value!r}"

    def reason(self) -> str:
        """`hsp_groups=3 does not divide the world size 4` (a tuner trial's reason)."""
        return f"{self.key}={self.value!r} {self.fails}"


Rule = Callable[[Any, JobShape], tuple[str, str] | None]


def _at_least_one(value: Any, shape: JobShape) -> tuple[str, str] | None:
    return None if value >= 1 else ("must be >= 1", "must be at least 1")


def _micro_batches(value: Any, shape: JobShape) -> tuple[str, str] | None:
    local = shape.per_rank_batch
    if value > MAX_MICRO_BATCHES:
        return f"must be <= {MAX_MICRO_BATCHES}", f"is above {MAX_MICRO_BATCHES}"
    if local is None:
        return None
    group = shape.sample_group
    if group > 1:  # whole softmax groups per micro-batch: the loss must not depend on N
        groups = local // group
        if value > groups or groups % value:
            return (f"must divide the per-rank batch's {groups} softmax groups of {group}",
                    f"does not divide the per-rank batch's {groups} softmax groups of {group}")
        return None
    if value > local:
        return (f"must be <= the per-rank batch ({local})",
                f"is larger than the per-rank batch {local}")
    if local % value:
        return (f"must divide the per-rank batch ({local})",
                f"does not divide the per-rank batch {local}")
    return None


def _hsp_groups(value: Any, shape: JobShape) -> tuple[str, str] | None:
    if shape.world_size % value:
        return (f"must divide the world size ({shape.world_size})",
                f"does not divide the world size {shape.world_size}")
    return None


def _reshape(value: Any, shape: JobShape) -> tuple[str, str] | None:
    dim = shape.embedding_dim
    if dim is not None and dim % value:
        return f"must divide embedding_dim ({dim})", f"does not divide the embedding dim {dim}"
    return None


#: Per knob, checks in order; the first that fails is the knob's problem. Type and `allowed`
#: values are checked for every knob before these.
_RULES: dict[str, tuple[Rule, ...]] = {
    "micro_batches": (_at_least_one, _micro_batches),
    "hsp_groups": (_at_least_one, _hsp_groups),
    "reshape": (_at_least_one, _reshape),
}


def _type_problem(knob: Knob, value: Any) -> tuple[str, str] | None:
    ok = isinstance(value, knob.kind) and (knob.kind is bool or not isinstance(value, bool))
    if not ok:
        words = {int: "an integer", bool: "true or false", str: "a string"}[knob.kind]
        return f"must be {words}", f"is not {words}"
    if knob.allowed and value not in knob.allowed:
        return (f"must be one of {'|'.join(knob.allowed)}",
                f"is not one of {', '.join(knob.allowed)}")
    return None


def problems(knobs: Mapping[str, Any], shape: JobShape) -> list[Problem]:
    """Every knob value in `knobs` that cannot run on `shape` (unknown keys are ignored: the
    trainer checks its config keys itself, and a search space may hold other config keys)."""
    found = []
    for name, value in knobs.items():
        knob = KNOBS.get(name)
        if knob is None:
            continue
        checks = (lambda v, s, k=knob: _type_problem(k, v), *_RULES.get(name, ()))
        for check in checks:
            failed = check(value, shape)
            if failed is not None:
                found.append(Problem(name, value, *failed))
                break
    return found


def invalid_reason(knobs: Mapping[str, Any], shape: JobShape) -> str | None:
    """Why this configuration cannot run on this job shape (the tuner's wording), or None."""
    found = problems(knobs, shape)
    return found[0].reason() if found else None


# --- configurations --------------------------------------------------------------------------


def searched_by_default() -> list[str]:
    """Knobs in `recprof tune`'s default space, in declaration order."""
    return [name for name, knob in KNOBS.items() if knob.searched]


#: The synchronous fp32 baseline every study starts from, for the default space's knobs (the
#: others keep the base config's value).
BASELINE: Knobs = {name: KNOBS[name].baseline for name in searched_by_default()}


def acting_on(effect: str, lossy: bool | None = None) -> tuple[str, ...]:
    """Knobs whose mechanism is `effect` (BYTES, OVERLAP, BALANCE or LAUNCH), optionally only
    the lossy (True) or lossless (False) ones."""
    return tuple(name for name, knob in KNOBS.items()
                 if effect in knob.acts_on and (lossy is None or knob.lossy == lossy))


def is_lossy(knobs: Mapping[str, Any]) -> bool:
    """Whether a configuration departs from the baseline on a lossy knob (quality can change)."""
    return any(knob.lossy and knobs.get(name, knob.baseline) != knob.baseline
               for name, knob in KNOBS.items())


def canonical(knobs: Mapping[str, Any]) -> Knobs:
    """Rewrite values that cannot change the run to one representative, so two configs that
    train the same compare equal. Clustering regroups samples across micro-batches, so with
    one micro-batch it does nothing."""
    out = dict(knobs)
    if int(out.get("micro_batches", 1)) == 1 and "clustering" in out:
        out["clustering"] = False
    return out


def knobs_key(knobs: Mapping[str, Any]) -> str:
    """A stable string identity for a canonical configuration (dedup and storage)."""
    return json.dumps(dict(sorted(knobs.items())), sort_keys=True, separators=(",", ":"))


def knobs_label(knobs: Mapping[str, Any]) -> str:
    """A compact one-line config, e.g. `N=2 M=1 q=bf16 k=1 dbp clustering`."""
    parts = []
    for name, value in knobs.items():
        if isinstance(value, bool):
            if value:
                parts.append(name)
        else:
            parts.append(f"{KNOBS[name].short if name in KNOBS else name}={value}")
    return " ".join(parts)



def settings_on(knobs: Mapping[str, Any]) -> list[str]:
    """`["fuse_tables=true", "qcomms=bf16"]`: the knobs that are on in the form the trainer's
    settings label carries them (vocabulary.NESTPIPE_SETTINGS): each switch that is true, each
    other knob away from the synchronous baseline. The analysis reads them back as settings
    already on, so a finding never proposes turning on what this run had on."""
    return [f"{name}={str(value).lower()}" for name, value in knobs.items()
            if name in KNOBS and (value is True if isinstance(value, bool)
                                  else value != KNOBS[name].baseline)]
