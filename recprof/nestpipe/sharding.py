"""Where every embedding row lives: the shard layout and the process groups that follow from HSP.

With `hsp_groups` = M and world size P, ranks form M sharding groups of G = P / M consecutive
ranks; each group holds a full replica of every table, sharded over its G ranks. Rank r is
shard `r % G` of group `r // G`; the ranks holding the same shard in different groups form a
replica group, the only place embedding gradients cross group boundaries (HSP all-reduce).

Every rank stores its rows of all tables in one (local_rows, dim) matrix; a (table, row) key
maps to an (owner shard, local slot) pair that the requester computes itself, so only slots
travel on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from recprof.nestpipe.config import TrainConfig


@dataclass
class Groups:
    """The process groups one rank uses: all ranks, its sharding group, its replica group."""

    rank: int
    world: int
    shard: int  # this rank's shard index inside its sharding group
    group_size: int  # G
    hsp_groups: int  # M
    shard_group: dist.ProcessGroup
    replica_group: dist.ProcessGroup | None  # None when M == 1
    # The same ranks as shard_group, for DBP's routing and prefetch of the next batch: a
    # communicator (and NCCL stream) of its own, so that exchange is not queued behind this
    # batch's gradients. One thread issues both groups' collectives (schedule.py).
    prefetch_group: dist.ProcessGroup | None = None


def make_groups(cfg: TrainConfig) -> Groups:
    """Create the sharding and replica groups; every rank calls this (new_group is collective).

    Their members are `TrainConfig.group_members`'s, which the analysis and what-if read too:
    one definition of who exchanges with whom."""
    rank, world = dist.get_rank(), dist.get_world_size()
    hsp_groups = cfg.hsp_groups
    size = cfg.group_size("embedding_rows_fwd", world)
    sharding = [list(cfg.group_members("embedding_rows_fwd", g * size, world))
                for g in range(hsp_groups)]
    shard_group: dist.ProcessGroup = dist.group.WORLD
    replica_group = None
    if hsp_groups > 1:
        shard_group = _own_group(sharding, rank)
        replica_group = _own_group([list(cfg.group_members("hsp_embedding_grads", s, world))
                                    for s in range(size)], rank)
    prefetch_group = _own_group(sharding, rank) if cfg.dbp else None
    return Groups(rank, world, rank % size, size, hsp_groups, shard_group, replica_group,
                  prefetch_group)


def _own_group(members: list[list[int]], rank: int) -> dist.ProcessGroup:
    """Create every group (in the same order on every rank) and return the one holding rank."""
    own = None
    for ranks in members:
        group = dist.new_group(ranks)
        if rank in ranks:
            own = group
    assert own is not None, f"rank {rank} is in none of {members}"
    return own


class Layout:
    """Row ownership for row-wise (cyclic hash) or table-wise sharding over G shards."""

    def __init__(self, table_rows: list[int], group_size: int, sharding: str) -> None:
        self.rows = table_rows
        self.size = group_size
        self.sharding = sharding
        counts = torch.tensor(
            [[self._count(t, s) for t in range(len(table_rows))] for s in range(group_size)]
        )  # (G, T) rows of table t held by shard s
        self.offsets = torch.cumsum(counts, 1) - counts  # slot of each table's first row, per shard
        self.local_rows = counts.sum(1).tolist()

    def _count(self, table: int, shard: int) -> int:
        if self.sharding == "table":
            return self.rows[table] if table % self.size == shard else 0
        first = (shard - table) % self.size
        return max(0, (self.rows[table] - first + self.size - 1) // self.size)

    def locate(self, table: int | torch.Tensor, rows: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(owner shard, local slot) for rows of one table, or of the table beside each row.

        Row-wise: owner = (row + table) mod G, so hot rows (any ids) spread evenly and tables
        start on different shards; table-wise: the whole table on shard table mod G, which is
        imbalanced whenever tables differ in size or traffic.
        """
        table = torch.as_tensor(table, device=rows.device).expand_as(rows)
        offsets = self.offsets.to(rows.device)
        if self.sharding == "table":
            owner = table % self.size
            return owner, rows + offsets[owner, table]
        owner = (rows + table) % self.size
        return owner, offsets[owner, table] + rows // self.size

    def shard_rows(self, table: int, shard: int) -> torch.Tensor:
        """Global row ids of `table` held by `shard`, in local-slot order."""
        if self.sharding == "table":
            if table % self.size != shard:
                return torch.empty(0, dtype=torch.int64)
            return torch.arange(self.rows[table])
        return torch.arange((shard - table) % self.size, self.rows[table], self.size)
