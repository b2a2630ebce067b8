"""The trainer's configuration: one flat set of keys, loaded from YAML/TOML plus `--set` overrides.

The keys are flat on purpose: the tuner and the report's findings address knobs by bare name
(`qcomms=fp16`, `hsp_groups=2`), so a key is the same string in a file, on the command line and
in `summary.json`. The knob keys themselves (their types, defaults and validity) come from the
knob registry (recprof/nestpipe/knobs.py), which the tuner reads too. Every problem is a
`RecprofError` whose message starts with the key.
"""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from recprof.errors import RecprofError
from recprof.nestpipe.knobs import KNOBS, JobShape, problems

if TYPE_CHECKING:
    import torch

BACKEND_CHOICES = ("auto", "gloo", "nccl")
DATA_CHOICES = ("synthetic", "tsv")
DENSE_OPTIMIZERS = ("adagrad", "sgd", "adam")
#: The dense models (recprof/nestpipe/model.py): DLRM (bottom MLP, dot interaction, top MLP, one
#: logit, binary cross-entropy) and two-tower retrieval (a query and a candidate tower over
#: their own tables, dot product, in-batch negatives with a softmax loss).
MODELS = ("dlrm", "two_tower")
#: The keys only one model reads (the others are every model's).
MODEL_ONLY_KEYS = {"dlrm": ("bottom_mlp", "top_mlp"),
                   "two_tower": ("query_features", "query_tables", "query_mlp",
                                 "candidate_mlp", "softmax_group", "recall_k")}
#: The config's "# model" keys, every model's: two runs that differ in any of them train
#: different models, so their times are of different work (`recprof compare` warns).
MODEL_KEYS = ("model", "num_dense", "num_features", "num_tables", "num_embeddings",
              "embedding_dim", *dict.fromkeys(k for keys in MODEL_ONLY_KEYS.values()
                                              for k in keys))
#: Each model's dense widths: what `recprof mirror` scales to fit a job's step.
DENSE_WIDTH_KEYS = {"dlrm": ("bottom_mlp", "top_mlp"), "two_tower": ("query_mlp", "candidate_mlp")}
#: The synthetic source numbers every random draw of a batch with a 32-bit counter
#: (recprof/nestpipe/data.py): a batch holds at most this many draws of one kind.
SYNTHETIC_COUNTERS = 1 << 32
#: Floating-point precision of a run's parameters, optimizer state and exchanged tensors.
DTYPES = ("float32", "float64")


def _with_knob_fields(cls: type) -> type:
    """Add one field per registry knob (its type, its baseline as the default) before
    @dataclass reads the class, so a knob is declared once, in the registry."""
    for knob in KNOBS.values():
        cls.__annotations__[knob.name] = knob.kind.__name__
        setattr(cls, knob.name, knob.baseline)
    return cls


@dataclass
@_with_knob_fields
class TrainConfig:
    """Every key the trainer accepts, with defaults that train a small model on CPU."""

    # schedule
    steps: int = 60
    warmup_steps: int = 10
    seed: int = 0
    batch_size: int = 1024
    eval_batches: int = 4
    # data
    data: str = "synthetic"
    data_path: str = ""
    eval_data_path: str = ""
    zipf_alpha: float = 1.1
    vocab_size: int = 100_000
    bag_size: int = 4
    signal_scale: float = 1.0
    num_workers: int = 1
    pin_memory: bool = True
    # model
    model: str = "dlrm"
    num_dense: int = 13
    num_features: int = 8
    num_tables: int = 8
    num_embeddings: int | list[int] = 20_000
    embedding_dim: int = 16
    bottom_mlp: list[int] = field(default_factory=lambda: [64])
    top_mlp: list[int] = field(default_factory=lambda: [64, 32])
    # two-tower (model: two_tower). The first query_features sparse features (and the dense
    # ones) feed the query tower and are looked up in the first query_tables tables; the rest
    # feed the candidate tower from the other tables. Each tower's MLP ends in the width of the
    # dot product. A query scores its own candidate against the other candidates of its
    # softmax group (softmax_group consecutive samples of the global batch), so no knob changes
    # which negatives a sample sees; eval recall@recall_k ranks each query's candidate among
    # every candidate of the eval batch.
    query_features: int = 4
    query_tables: int = 4
    query_mlp: list[int] = field(default_factory=lambda: [64, 32])
    candidate_mlp: list[int] = field(default_factory=lambda: [64, 32])
    softmax_group: int = 16
    recall_k: int = 10
    # optimizers
    dense_optimizer: str = "adagrad"
    dense_lr: float = 0.05
    embedding_lr: float = 0.05
    adagrad_eps: float = 1e-8
    # runtime
    backend: str = "auto"
    dtype: str = "float32"
    # ... and one field per knob of recprof/nestpipe/knobs.py (micro_batches, hsp_groups,
    # qcomms, reshape, dbp, clustering, sharding, fuse_tables), added by _with_knob_fields.

    def knobs(self) -> dict[str, Any]:
        """The registry knobs' values in this config."""
        return {name: getattr(self, name) for name in KNOBS}

    def table_rows(self) -> list[int]:
        """Rows per table after reshape: capacity kept, so rows grow by the factor k."""
        base = self.num_embeddings
        sizes = base if isinstance(base, list) else [base] * self.num_tables
        return [n * self.reshape for n in sizes]

    def float_dtype(self) -> torch.dtype:
        """The torch dtype of `dtype`; torch is imported here, not at module level, so the
        tuner and the command line read configs without it."""
        import torch

        return getattr(torch, self.dtype)

    def group_members(self, purpose: str, rank: int, world: int) -> tuple[int, ...]:
        """The ranks of the process group `rank` runs a collective of `purpose` on (the
        trainer's `sharding.make_groups` builds its groups from this): the row exchanges stay
        inside a sharding group of world / hsp_groups consecutive ranks, HSP's gradient sum
        runs across the hsp_groups replicas of the rank's shard, the rest on every rank."""
        size = max(world // self.hsp_groups, 1)
        if purpose in _SHARDING_GROUP_PURPOSES:
            first = rank // size * size
            return tuple(range(first, first + size))
        if purpose == "hsp_embedding_grads":
            return tuple(rank % size + g * size for g in range(self.hsp_groups))
        return tuple(range(world))

    def group_size(self, purpose: str, world: int) -> int:
        """Ranks in the process group a collective of `purpose` runs on. A group of one
        exchanges with itself: a local copy that never reaches the wire."""
        return len(self.group_members(purpose, 0, world))

    def table_of_feature(self) -> list[int]:
        """The table each sparse feature is looked up in: feature f in table f % num_tables for
        DLRM; for two-tower, the query features cycle over the first query_tables tables and the
        candidate features over the rest, so each tower has tables of its own."""
        if self.model != "two_tower":
            return [f % self.num_tables for f in range(self.num_features)]
        fq, tq = self.query_features, self.query_tables
        return [f % tq if f < fq else tq + (f - fq) % (self.num_tables - tq)
                for f in range(self.num_features)]

    @property
    def sample_group(self) -> int:
        """Consecutive samples that a micro-batch must hold together (`sample_group`)."""
        return sample_group(vars(self))

    def dense_parameters(self) -> int:
        """Weights and biases of the dense model (recprof/nestpipe/model.py): what the dense
        all-reduce carries each step, one value each, plus the loss."""
        if self.model == "two_tower":
            chains = [[self.num_dense + self.query_features * self.dim, *self.query_mlp],
                      [(self.num_features - self.query_features) * self.dim,
                       *self.candidate_mlp]]
        else:
            pairs = (self.num_features + 1) * self.num_features // 2
            chains = [[self.num_dense, *self.bottom_mlp, self.dim],
                      [self.dim + pairs, *self.top_mlp, 1]]
        # the candidate tower's last layer has no bias (model.py, TwoTower)
        unbiased = self.candidate_mlp[-1] if self.model == "two_tower" else 0
        return sum((a + 1) * b for chain in chains for a, b in itertools.pairwise(chain)) \
            - unbiased

    @property
    def dim(self) -> int:
        """Embedding width on the wire and in the interaction, after reshape."""
        return self.embedding_dim // self.reshape

    def to_dict(self) -> dict[str, Any]:
        """The resolved configuration, as written into summary.json."""
        return dataclasses.asdict(self)


def sample_group(values: Mapping[str, Any]) -> int:
    """Consecutive samples a micro-batch must hold together under a config's `values` (a
    file's mapping or a config's fields): a two-tower softmax group, whose queries score each
    other's candidates; one sample for DLRM. The knobs' `JobShape.sample_group`."""
    if values.get("model", TrainConfig.model) != "two_tower":
        return 1
    group = values.get("softmax_group", TrainConfig.softmax_group)
    return group if isinstance(group, int) and group >= 1 else 1


#: The trainer's collective purposes (trace/vocabulary.py) that run inside a sharding group.
_SHARDING_GROUP_PURPOSES = frozenset({"key_routing", "embedding_rows_fwd", "embedding_grads_bwd",
                                      "prefetch", "dbp_refresh"})

_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _type_name(annotation: str) -> str:
    return {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "str": "a string",
        "list[int]": "a list of integers",
        "int | list[int]": "an integer or a list of integers",
    }[annotation]


def _coerce(key: str, value: Any) -> Any:
    """Check one value against the key's declared type; ints are accepted where floats are."""
    annotation = str(_FIELDS[key].type)
    ok: bool
    if annotation == "bool":
        ok = isinstance(value, bool)
    elif annotation == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif annotation == "str":
        ok = isinstance(value, str)
    else:
        is_int_list = isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        )
        ok = is_int_list or (
            annotation == "int | list[int]" and isinstance(value, int)
            and not isinstance(value, bool)
        )
    if not ok:
        raise RecprofError(f"{key}: expected {_type_name(annotation)}, got {value!r}")
    return value


def read_config_file(path: Path) -> dict[str, Any]:
    """A config file's mapping (YAML, or TOML by suffix); the tuner reads base configs with it."""
    if not path.is_file():
        raise RecprofError(f"config: no such file {path}")
    text = path.read_text()
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (yaml.YAMLError, ValueError) as exc:  # TOMLDecodeError is a ValueError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RecprofError(f"config: {path} does not parse: {first}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecprofError(f"config: {path} must hold a mapping of keys to values")
    return data


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise RecprofError(f"--set: expected key=value, got {item!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def load_config(path: Path | None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Read the file (YAML unless it ends in .toml), apply `--set key=value`, check each value."""
    values: dict[str, Any] = read_config_file(path) if path is not None else {}
    for item in overrides:
        key, value = _parse_override(item)
        values[key] = value
    for key in values:
        if key not in _FIELDS:
            raise RecprofError(f"{key}: unknown config key")
    return TrainConfig(**{k: _coerce(k, v) for k, v in values.items()})


def _require(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise RecprofError(f"{key}: {problem}")


def validate(cfg: TrainConfig, world_size: int) -> None:
    """Check the values against each other and against the job shape; raise on the first problem."""
    for key in ("steps", "batch_size", "num_features", "num_tables", "embedding_dim",
                "vocab_size", "bag_size"):
        _require(getattr(cfg, key) >= 1, key, f"must be >= 1, got {getattr(cfg, key)}")
    _require(cfg.model in MODELS, "model", f"must be one of {'|'.join(MODELS)}, got {cfg.model!r}")
    # A two-tower model may have no dense features (TorchRec's retrieval example has none).
    fewest_dense = 0 if cfg.model == "two_tower" else 1
    _require(cfg.num_dense >= fewest_dense, "num_dense",
             f"must be >= {fewest_dense}, got {cfg.num_dense}")
    for key in ("warmup_steps", "eval_batches", "num_workers"):
        _require(getattr(cfg, key) >= 0, key, f"must be >= 0, got {getattr(cfg, key)}")
    _require(cfg.warmup_steps < cfg.steps, "warmup_steps",
             f"must be < steps ({cfg.steps}) to leave a steady window, got {cfg.warmup_steps}")
    _require(cfg.backend in BACKEND_CHOICES, "backend",
             f"must be one of {'|'.join(BACKEND_CHOICES)}, got {cfg.backend!r}")
    _require(cfg.dtype in DTYPES, "dtype",
             f"must be one of {'|'.join(DTYPES)}, got {cfg.dtype!r}")
    _require(cfg.data in DATA_CHOICES, "data",
             f"must be one of {'|'.join(DATA_CHOICES)}, got {cfg.data!r}")
    _require(cfg.dense_optimizer in DENSE_OPTIMIZERS, "dense_optimizer",
             f"must be one of {'|'.join(DENSE_OPTIMIZERS)}, got {cfg.dense_optimizer!r}")
    _require(cfg.data != "tsv" or bool(cfg.data_path), "data_path",
             "required when data is tsv")
    _require(cfg.zipf_alpha > 0, "zipf_alpha", f"must be > 0, got {cfg.zipf_alpha}")
    _require(cfg.data != "synthetic" or max(cfg.num_features * cfg.bag_size, cfg.num_dense)
             * cfg.batch_size <= SYNTHETIC_COUNTERS, "batch_size",
             f"batch_size x num_features x bag_size (and x num_dense) must stay within "
             f"{SYNTHETIC_COUNTERS:,} synthetic draws per batch, got {cfg.batch_size} x "
             f"{cfg.num_features} x {cfg.bag_size}")
    for key in ("dense_lr", "embedding_lr", "adagrad_eps"):
        _require(getattr(cfg, key) > 0, key, f"must be > 0, got {getattr(cfg, key)}")
    if isinstance(cfg.num_embeddings, list):
        _require(len(cfg.num_embeddings) == cfg.num_tables, "num_embeddings",
                 f"lists {len(cfg.num_embeddings)} tables but num_tables is {cfg.num_tables}")
    _require(all(n >= 1 for n in cfg.table_rows()), "num_embeddings", "every table needs >= 1 row")
    _require(cfg.num_tables <= cfg.num_features, "num_tables",
             f"must be <= num_features ({cfg.num_features}): every table needs a feature")
    _require(all(n >= 1 for n in cfg.bottom_mlp + cfg.top_mlp), "bottom_mlp",
             "layer widths must be >= 1")
    _require(cfg.batch_size % world_size == 0, "batch_size",
             f"must be a multiple of the world size ({world_size}), got {cfg.batch_size}")
    if cfg.model == "two_tower":
        _validate_two_tower(cfg, world_size)
    shape = JobShape(world_size, cfg.batch_size, cfg.embedding_dim, cfg.sample_group)
    for problem in problems(cfg.knobs(), shape):
        raise RecprofError(problem.config_error())


def _validate_two_tower(cfg: TrainConfig, world_size: int) -> None:
    """The towers' features, tables and widths, and softmax groups that tile each rank's batch."""
    _require(1 <= cfg.query_features < cfg.num_features, "query_features",
             f"must be >= 1 and < num_features ({cfg.num_features}): each tower needs a "
             f"feature, got {cfg.query_features}")
    _require(1 <= cfg.query_tables < cfg.num_tables, "query_tables",
             f"must be >= 1 and < num_tables ({cfg.num_tables}): each tower needs a table of "
             f"its own, got {cfg.query_tables}")
    _require(cfg.query_tables <= cfg.query_features, "query_tables",
             f"must be <= query_features ({cfg.query_features}): every table needs a feature, "
             f"got {cfg.query_tables}")
    candidates = cfg.num_features - cfg.query_features
    _require(cfg.num_tables - cfg.query_tables <= candidates, "num_tables",
             f"the candidate tower's {cfg.num_tables - cfg.query_tables} tables need as many "
             f"features, it has {candidates}")
    for key in ("query_mlp", "candidate_mlp"):
        widths = getattr(cfg, key)
        _require(bool(widths) and all(w >= 1 for w in widths), key,
                 f"must list one or more widths >= 1, got {widths}")
    _require(cfg.query_mlp[-1] == cfg.candidate_mlp[-1], "candidate_mlp",
             f"must end in the query tower's width ({cfg.query_mlp[-1]}) for the dot product, "
             f"got {cfg.candidate_mlp[-1]}")
    _require(cfg.recall_k >= 1, "recall_k", f"must be >= 1, got {cfg.recall_k}")
    per_rank = cfg.batch_size // world_size
    _require(cfg.softmax_group >= 1 and per_rank % cfg.softmax_group == 0, "softmax_group",
             f"must divide the per-rank batch ({per_rank}), got {cfg.softmax_group}")
