"""The embedding tables' facts, from every form of lookup a trace carries, each with its source.

A job's tables show in its trace in several forms, and which ones depends on how it looks them
up (recprof/mirror/shape.py reads them):

- per-table bags, `aten::embedding_bag` (and `aten::embedding` pooled by hand): weights
  `[rows, dim]`, ids and bags per call;
- fbgemm's table-batched lookup (TBE), in its CPU forward (`split_embedding_codegen_forward_cpu`,
  under old and current fbgemm alike) and its current `..._function_pt2` lookup: the weights of
  every table in one flat tensor (`[67108864]`, rows x dim), `D_offsets` (one entry per
  looked-up feature, plus one), `total_D` (the features' widths summed) and offsets
  (`features x batch + 1`); the pt2 lookup also carries the optimizer's state, which for a
  row-wise optimizer is one entry per row (`[1048576]`), so flat weights / state is the width;
- the pooled-embedding all-to-all (TorchRec's `pooled_embeddings_fwd`): each looked-up bag's
  pooled vector, so its bytes per step over the bags a rank looks up are dim x bytes per value;
- the dense layers: the first one's input width, and in a DLRM the bottom MLP's output, which
  the dot interaction needs to be the embedding width.

`table_facts` gathers every reading of each fact, preferred source first; the mirror uses the
first and says where it came from, and a fact whose sources disagree is said in the mirror's
header, never settled silently. (fbgemm counts features, not tables: a table shared by two
features counts twice; TorchRec's examples give every table one feature.)
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

from recprof.analysis.model import JobAnalysis
from recprof.mirror.shape import Linear, RankShape, TableBatch

#: Bytes of one float32 value: the embedding all-to-all's width in values, unless the job
#: compresses its wire (QComms fp16/bf16 halve it; the disagreement then says so).
FLOAT32_BYTES = 4
#: The collective purpose that carries one pooled vector per looked-up bag (trace/vocabulary).
POOLED_PURPOSE = "pooled_embeddings_fwd"

#: Fact names, in the order the mirror's header lists them.
FACTS = ("embedding_dim", "tables", "rows_per_table", "lookup_batch", "features", "ids_per_bag",
         "first_dense_width", "exchange_bytes_per_bag")


@dataclass(frozen=True)
class Reading:
    """One source's value of a fact."""

    value: int | float
    source: str


@dataclass
class TableFacts:
    """Every reading of every fact, the preferred source first."""

    readings: dict[str, list[Reading]] = field(default_factory=dict)

    def add(self, fact: str, value: int | float, source: str) -> None:
        self.readings.setdefault(fact, []).append(Reading(value, source))

    def get(self, fact: str) -> Reading | None:
        """The preferred reading of `fact`, or None when no source shows it."""
        found = self.readings.get(fact)
        return found[0] if found else None

    def value(self, fact: str) -> int | float | None:
        reading = self.get(fact)
        return reading.value if reading is not None else None

    def disagreements(self) -> list[str]:
        """One line per fact whose sources give different values."""
        lines = []
        for fact in FACTS:
            found = self.readings.get(fact, [])
            if len({_rounded(r.value) for r in found}) > 1:
                said = "; ".join(f"{_shown(r.value)} from {r.source}" for r in found)
                lines.append(f"{fact}: the sources disagree: {said} (the first is used)")
        return lines

    def lines(self) -> list[str]:
        """Every fact with every source's value, for the mirror's header."""
        out = []
        for fact in FACTS:
            for i, r in enumerate(self.readings.get(fact, [])):
                out.append(f"{fact if i == 0 else ' ' * len(fact)}  {_shown(r.value)}: "
                           f"{r.source}")
        return out


def _rounded(value: int | float) -> float:
    return round(float(value), 2)


def _shown(value: int | float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def table_facts(job: JobAnalysis, shapes: list[RankShape], per_rank_batch: int | None,
                linears: list[Linear]) -> TableFacts:
    """The facts of the job's tables from every rank's lookups, its all-to-alls and its dense
    layers (`per_rank_batch`: samples per rank, from the dense layers' inputs)."""
    facts = TableFacts()
    world = job.world
    global_batch = per_rank_batch * world if per_rank_batch else None
    pt2 = [_summed(s.tbe_lookups) for s in shapes if s.tbe_lookups]
    forward = [_summed(s.table_batches) for s in shapes if s.table_batches]
    for calls in (pt2, forward):
        if calls:
            _from_tbe(facts, calls, global_batch)
    _from_bags(facts, shapes, per_rank_batch)
    if linears:
        first = linears[0]
        facts.add("first_dense_width", first.width_in,
                  f"aten::linear: the first dense layer's input [{first.batch}, "
                  f"{first.width_in}]")
        bottom = bottom_output(linears)
        if bottom is not None:
            facts.add("embedding_dim", bottom,
                      "the bottom MLP's output (the dot interaction's vector width)")
    _from_exchange(facts, job, pt2 or forward)
    return facts


def _summed(calls: list[TableBatch]) -> TableBatch:
    """A rank's table-batched lookups of one step as one: the tables of all its calls."""
    if len(calls) == 1:
        return calls[0]
    dims = [c.total_dim for c in calls]
    states = [c.state_rows for c in calls]
    return TableBatch(
        sum(c.weights for c in calls), sum(c.tables for c in calls),
        sum(c.indices for c in calls), sum(c.bags for c in calls),
        sum(d for d in dims if d is not None) if None not in dims else None,
        sum(s for s in states if s is not None) if None not in states else None,
        calls[0].optimizer)


def _form(call: TableBatch) -> str:
    return (f"fbgemm's lookup_{call.optimizer}_function_pt2" if call.optimizer else
            "fbgemm's split_embedding_codegen_forward_cpu")


def _from_tbe(facts: TableFacts, calls: list[TableBatch], global_batch: int | None) -> None:
    """Facts of fbgemm's table-batched lookups, one summed call per rank that looks up."""
    form = _form(calls[0])
    tables = sum(c.tables for c in calls)
    facts.add("tables", tables, f"{form}: D_offsets, "
              f"{' + '.join(str(c.tables) for c in calls)} on the ranks")
    widths = {c.total_dim // c.tables for c in calls
              if c.total_dim is not None and c.total_dim % c.tables == 0}
    if len(widths) == 1:
        dim = next(iter(widths))
        facts.add("embedding_dim", dim, f"{form}: total_D {calls[0].total_dim} / "
                  f"{calls[0].tables} tables")
    rowwise = [c for c in calls if c.state_rows]
    if rowwise:
        c = rowwise[0]
        facts.add("embedding_dim", c.weights // c.state_rows,
                  f"{form}: flat weights [{c.weights}] / its row-wise optimizer state "
                  f"[{c.state_rows}] (one entry per row)")
        per_table = {r.state_rows // r.tables for r in rowwise if r.state_rows % r.tables == 0}
        if len(per_table) == 1:
            facts.add("rows_per_table", per_table.pop(),
                      f"{form}: row-wise optimizer state [{c.state_rows}] / {c.tables} tables "
                      "(equal rows per table assumed)")
    dim = facts.value("embedding_dim")
    if isinstance(dim, int) and dim > 0:
        rows = {c.weights // (c.tables * dim) for c in calls if c.weights % (c.tables * dim) == 0}
        if len(rows) == 1:
            facts.add("rows_per_table", rows.pop(), f"{form}: flat weights / (tables x "
                      f"embedding_dim {dim}) (equal rows per table assumed)")
    batches = {c.bags // c.tables for c in calls}
    if len(batches) == 1:
        batch = batches.pop()
        facts.add("lookup_batch", batch, f"{form}: offsets of {calls[0].bags + 1} = tables "
                  f"{calls[0].tables} x batch + 1")
    if global_batch:
        bags = sum(c.bags for c in calls)
        facts.add("features", bags // global_batch,
                  f"{form}: {bags} bags on the ranks / global batch {global_batch}")
    pooling = sum(c.indices for c in calls) / max(sum(c.bags for c in calls), 1)
    facts.add("ids_per_bag", pooling, f"{form}: indices / bags")


def _from_bags(facts: TableFacts, shapes: list[RankShape], per_rank_batch: int | None) -> None:
    """Facts of per-table lookups: `aten::embedding_bag`, `aten::embedding` pooled by hand."""
    bags = [b for s in shapes for b in s.embedding_bags]
    if bags:
        dim = Counter(b[1] for b in bags).most_common(1)[0][0]
        facts.add("embedding_dim", dim, "aten::embedding_bag weights [rows, dim]")
        indices, count = sum(b[2] for b in bags), sum(b[3] for b in bags)
        facts.add("ids_per_bag", indices / max(count, 1), "aten::embedding_bag: ids / bags")
        if per_rank_batch:
            facts.add("features", max(1, round(count / len(bags) / per_rank_batch)),
                      "aten::embedding_bag bags / per-rank batch")
    lookups = [e for s in shapes for e in s.embeddings]
    if lookups:
        dim = Counter(e[1] for e in lookups).most_common(1)[0][0]
        facts.add("embedding_dim", dim, "aten::embedding weights [rows, dim]")
    pooled = [p for s in shapes for p in s.pooled
              if per_rank_batch is None or p[0] == per_rank_batch]
    if pooled and lookups:
        batch, count, bag, dim = Counter(pooled).most_common(1)[0][0]
        facts.add("features", count, f"aten::sum over [batch, features, bag, dim] = "
                  f"[{batch}, {count}, {bag}, {dim}] after aten::embedding")
        facts.add("ids_per_bag", bag, f"aten::sum over [batch, features, bag, dim] = "
                  f"[{batch}, {count}, {bag}, {dim}]: {bag} ids per bag")


def _from_exchange(facts: TableFacts, job: JobAnalysis, calls: list[TableBatch]) -> None:
    """The pooled-embedding all-to-all: bytes per step and rank over the bags a rank looks up
    is one pooled vector's bytes."""
    pooled = [c for c in job.collectives
              if c.kind == "all_to_all" and c.purpose == POOLED_PURPOSE and c.bytes_per_step]
    if not pooled or not calls:
        return
    sent = sum(c.bytes_per_step or 0.0 for c in pooled)
    bags = sum(c.bags for c in calls) / len(calls)
    per_bag = sent / bags
    facts.add("exchange_bytes_per_bag", per_bag,
              f"the pooled-embedding all-to-all: {sent:,.0f} B per step and rank / {bags:g} "
              "bags looked up per rank")
    if per_bag % FLOAT32_BYTES == 0:
        facts.add("embedding_dim", int(per_bag) // FLOAT32_BYTES,
                  f"the pooled-embedding all-to-all: {per_bag:g} B per bag / {FLOAT32_BYTES} B "
                  "per float32 (a 2-byte wire format, QComms fp16/bf16, would halve it)")


def bottom_output(linears: list[Linear]) -> int | None:
    """Where the first layer's chain narrows to the interaction: the bottom's output width is
    the embedding width in a DLRM, the first layer output followed by a layer whose input is
    not that output."""
    for a, b in itertools.pairwise(linears):
        if b.width_in != a.width_out:
            return a.width_out
    return None
