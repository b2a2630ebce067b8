"""The search space: which values of which knobs a study tries, from the defaults or a file.

A trial's configuration is a plain dict of knob -> value (`Knobs`). Every fact about a knob
(its type and values, its baseline, when it is invalid, its label) is the registry's
(recprof/nestpipe/knobs.py), shared with the trainer's own validation, so the tuner never
refuses a config the trainer accepts, or the other way round. Invalid combinations are found
before anything runs, and configurations are canonicalised so two dicts that would run the same
training compare equal and the second is answered from the study.
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
from recprof.nestpipe.knobs import (
    BASELINE,
    KNOBS,
    JobShape,
    Knobs,
    canonical,
    divisors,
    invalid_reason,
    knobs_key,
    searched_by_default,
)


@dataclass
class SearchSpace:
    """Ordered choices per knob, plus configurations to try right after the baseline.

    A knob with a single choice is fixed: it is not suggested to the sampler, so it adds no
    dimension to the search.
    """

    choices: dict[str, list[Any]]
    enqueue: list[Knobs] = field(default_factory=list)

    def baseline(self, base_config: Mapping[str, Any]) -> Knobs:
        """The synchronous fp32 baseline; other searched keys keep the base config's value, and
        a key the space fixes (one choice) runs at that value in the baseline too, as in every
        other trial (else the baseline alone would run another job)."""
        knobs: Knobs = {}
        for name, options in self.choices.items():
            if name in BASELINE:
                knobs[name] = BASELINE[name]
            elif len(options) == 1:
                knobs[name] = options[0]
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


def default_space(shape: JobShape) -> SearchSpace:
    """The registry's default space, with choices that are invalid on their own removed."""
    return SearchSpace(
        choices={name: KNOBS[name].default_choices(shape) for name in searched_by_default()}
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
    """Validate one knob's choices from the space file against its registry entry; `auto`
    only means something for HSP. Other config keys may be listed as plain values."""
    if values == "auto" and name == "hsp_groups":
        return divisors(shape.world_size)
    if not isinstance(values, list) or not values:
        raise RecprofError(f"{path}: knob {name!r} needs a non-empty list of values")
    if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
        raise RecprofError(f"{path}: knob {name!r} lists a value twice")
    if not all(isinstance(v, (str, int, float, bool)) for v in values):
        raise RecprofError(f"{path}: knob {name!r} values must be strings, numbers or booleans")
    knob = KNOBS.get(name)
    if knob is None:
        return list(values)
    if knob.allowed:
        bad = [v for v in values if v not in knob.allowed]
        if bad:
            raise RecprofError(f"{path}: {name} values {bad} are not among "
                               f"{', '.join(knob.allowed)}")
    elif knob.kind is int:
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise RecprofError(f"{path}: knob {name!r} takes positive integers, got {bad}")
    elif knob.kind is bool:
        bad = [v for v in values if not isinstance(v, bool)]
        if bad:
            raise RecprofError(f"{path}: knob {name!r} takes true/false, got {bad}")
    return list(values)
