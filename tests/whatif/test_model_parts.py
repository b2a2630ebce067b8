"""The what-if model's parts on inputs whose answer is known by hand: the replay's waits and
link order, the link fit, and the `--try` parser."""

from __future__ import annotations

import dataclasses

import pytest

from recprof.analysis.model import CollectiveSample
from recprof.errors import RecprofError
from recprof.whatif.command import parse_try
from recprof.whatif.costs import Network, fit_links
from recprof.whatif.replay import Collective, Compute, Post, Wait, replay


def test_a_collective_waits_for_the_last_rank_and_the_wait_counts_in_its_stage() -> None:
    programs = {
        0: [Compute("dense", 1.0), Post("x", "comm"), Wait("x", "comm"), Compute("opt", 1.0)],
        1: [Compute("dense", 3.0), Post("x", "comm"), Wait("x", "comm"), Compute("opt", 1.0)],
    }
    result = replay(programs, {"x": Collective((0, 1), 2.0)})
    assert result.step_us == pytest.approx(6.0)  # 3 (rank 1) + 2 transfer + 1
    assert result.ranks[0].stage_us["comm"] == pytest.approx(4.0)  # 2 waiting + 2 transfer
    assert result.ranks[1].stage_us["comm"] == pytest.approx(2.0)


def test_collectives_share_a_rank_link_in_post_order() -> None:
    # Both posted at 0; the second starts only when the first is off the link.
    program = [Post("a", "comm"), Post("b", "comm"), Compute("dense", 1.0), Wait("b", "comm")]
    colls = {"a": Collective((0,), 5.0), "b": Collective((0,), 5.0)}
    assert replay({0: program}, colls).step_us == pytest.approx(10.0)


def test_async_transfer_overlaps_compute() -> None:
    program = [Post("a", "comm"), Compute("dense", 4.0), Wait("a", "comm")]
    assert replay({0: program}, {"a": Collective((0,), 3.0)}).step_us == pytest.approx(4.0)


def test_blocking_posts_serialise_transfers_with_compute() -> None:
    # a CPU rank without a spare core: the transfer takes the core the compute needs
    program = [Post("a", "comm"), Compute("dense", 4.0), Wait("a", "comm")]
    result = replay({0: program}, {"a": Collective((0,), 3.0)}, blocking_posts=True)
    assert result.step_us == pytest.approx(7.0)
    assert result.stages == {"comm": pytest.approx(3.0), "dense": pytest.approx(4.0)}


def test_a_fetch_posted_before_the_compute_and_waited_after_it_is_hidden_and_delays_later_posts(
) -> None:
    # DBP on one thread: the next batch's fetch is posted before this batch's compute and
    # waited after the update; its transfer hides behind the compute, and the gradients posted
    # meanwhile queue behind it on the rank's link.
    program = [Compute("data_loading", 1.0), Post("fetch", "comm"), Compute("dense", 4.0),
               Post("grads", "comm"), Wait("grads", "comm"), Wait("fetch", "comm")]
    colls = {"fetch": Collective((0,), 6.0), "grads": Collective((0,), 2.0)}
    result = replay({0: program}, colls)
    assert result.step_us == pytest.approx(9.0)  # fetch 1..7, grads 7..9
    assert result.stages == {"data_loading": pytest.approx(1.0), "dense": pytest.approx(4.0),
                             "comm": pytest.approx(4.0)}


def test_a_graph_that_cannot_finish_is_an_error_not_a_hang() -> None:
    with pytest.raises(RecprofError, match="cannot finish"):
        replay({0: [Post("x", "comm"), Wait("x", "comm")], 1: [Compute("dense", 1.0)]},
               {"x": Collective((0, 1), 1.0)})


def _sample(kind: str, nbytes: float, dur: float, wait: float = 0.0,
            queued: float = 0.0) -> CollectiveSample:
    return CollectiveSample(rank=0, kind=kind, process_group="0", bytes=nbytes, dur_us=dur,
                            algbw_gbps=0.0, busbw_gbps=0.0, wait_us=wait, queued_us=queued)


def test_link_fit_recovers_latency_and_bandwidth_less_the_waits() -> None:
    # 50 us + 1 byte per 100 us... i.e. 100 B/us, each instance also waited 30 us for a peer
    samples = [_sample("all_to_all", b, 50 + b / 100 + 30, wait=30) for b in (1e3, 1e4, 1e5)]
    fit = fit_links(samples, 2)["all_to_all"]
    assert fit.latency_us == pytest.approx(50, rel=1e-6)
    assert fit.bytes_per_us == pytest.approx(100, rel=1e-6)
    assert fit.transfer_us(2e5) == pytest.approx(2050, rel=1e-6)


def test_link_fit_leaves_out_time_behind_the_ranks_earlier_collectives() -> None:
    # An all-reduce posted while a 2 ms all-to-all moves data ends after it: its line must not
    # take the all-to-all's transfer as its own latency. Where a wait for a peer and time in
    # the queue overlap, the longer one is left out, once.
    samples = [_sample("all_reduce", b, 2000 + 50 + b / 100, wait=500, queued=2000)
               for b in (1e3, 1e4, 1e5)]
    fit = fit_links(samples, 2)["all_reduce"]
    assert fit.latency_us == pytest.approx(50, rel=1e-6)
    assert fit.bytes_per_us == pytest.approx(100, rel=1e-6)


def test_queued_time_is_the_overlap_with_earlier_collectives_of_the_rank() -> None:
    import numpy as np

    from recprof.analysis.collectives import CollectiveRecords

    # a: 0-10; b posted at 2 ends at 15 (8 behind a); c posted at 20, alone; d inside b.
    start, end = np.array([0.0, 2.0, 20.0, 3.0]), np.array([10.0, 15.0, 25.0, 6.0])
    records = CollectiveRecords(step=np.zeros(4, dtype=np.int64), kind=["all_to_all"] * 4,
                                group=["0"] * 4, nbytes=np.ones(4), start=start, end=end,
                                exposed_by_key={})
    assert records.queued_us().tolist() == [0.0, 8.0, 0.0, 3.0]


def test_a_one_size_kind_borrows_the_link_bandwidth_with_bus_factors() -> None:
    samples = [_sample("all_to_all", b, 50 + b / 100) for b in (1e3, 1e4, 1e5)]
    samples += [_sample("all_reduce", 2e4, 900.0)] * 3
    fit = fit_links(samples, 2)["all_reduce"]
    # an all-to-all of 2 ranks moves half its bytes per rank, an all-reduce all of them
    assert fit.borrowed_from == "all_to_all"
    assert fit.bytes_per_us == pytest.approx(50, rel=1e-6)
    assert fit.latency_us == pytest.approx(900 - 2e4 / 50, rel=1e-6)
    assert "one message size" in fit.describe()


def test_a_collective_over_a_group_of_one_is_not_fitted_as_the_link() -> None:
    # HSP with one rank per sharding group: the row all-to-alls copy locally (2.5 MB in 0.1
    # ms); fitted in, they made the all-to-all link ~300x faster than the all-reduce showed.
    local = [_sample("all_to_all", b, 10 + b / 20_000) for b in (8.0, 4e4, 2.5e6)]
    wire = [_sample("all_reduce", b, 1000 + b / 125) for b in (1.5e5, 4.4e6)]
    fits = fit_links(local + wire, 2,
                     members=lambda s: 1 if s.kind == "all_to_all" else 2)
    assert "all_to_all" not in fits
    assert fits["all_reduce"].bytes_per_us == pytest.approx(125, rel=1e-6)
    # an all-to-all predicted on that link moves half its bytes per rank: twice the rate
    network = Network(fits, ranks_per_node=2, fitted_group=2)
    assert network.link("all_to_all").bytes_per_us == pytest.approx(250, rel=1e-6)
    assert network.link("all_to_all").borrowed_from == "all_reduce"
    # without the group sizes the local copies are the link (the old answer)
    assert fit_links(local + wire, 2)["all_to_all"].bytes_per_us > 10_000


def test_one_captured_rank_of_a_larger_job_keeps_its_line() -> None:
    # HTA's cpu_only is one rank of 300: its collectives crossed the wire, though only one
    # rank was captured; without the job's groups nothing is taken for a local copy.
    samples = [_sample("all_to_all", b, 50 + b / 100) for b in (1e3, 1e4, 1e5)]
    assert fit_links(samples, 1)["all_to_all"].bytes_per_us == pytest.approx(100, rel=1e-6)


def test_an_instance_over_a_smaller_group_counts_its_bytes_per_rank() -> None:
    # an all-to-all over 2 of 4 ranks moves 1/2 of its bytes per rank, over all 4 ranks 3/4:
    # its 3e4 B count as the 2e4 B that move as much at 4 ranks
    samples = [_sample("all_to_all", b, 50 + b / 100) for b in (1e3, 1e4, 1e5)]
    samples += [_sample("all_to_all", 3e4, 50 + 2e4 / 100)]
    sizes = {id(s): 4 for s in samples[:3]} | {id(samples[3]): 2}
    fit = fit_links(samples, 4, members=lambda s: sizes[id(s)])["all_to_all"]
    assert fit.bytes_per_us == pytest.approx(100, rel=1e-6)
    assert fit.latency_us == pytest.approx(50, rel=1e-6)


def test_the_trainers_groups_follow_hsp() -> None:
    from recprof.nestpipe.config import TrainConfig

    cfg = TrainConfig(hsp_groups=2)
    assert cfg.group_size("embedding_rows_fwd", 4) == 2
    assert cfg.group_size("key_routing", 2) == 1
    assert cfg.group_size("hsp_embedding_grads", 4) == 2
    assert cfg.group_size("dense_grads", 4) == 4
    # rank 3 of 4 in two groups of two: its sharding group, and its shard's replicas
    assert cfg.group_members("embedding_grads_bwd", 3, 4) == (2, 3)
    assert cfg.group_members("hsp_embedding_grads", 3, 4) == (1, 3)
    assert cfg.group_members("dense_grads", 3, 4) == (0, 1, 2, 3)


def test_try_parser_reads_values_as_yaml_and_rejects_junk() -> None:
    assert parse_try("micro_batches=4,qcomms=fp16,dbp=true") == {
        "micro_batches": 4, "qcomms": "fp16", "dbp": True}
    with pytest.raises(RecprofError, match="KEY=VALUE"):
        parse_try("micro_batches")


def test_network_sends_the_cross_node_share_over_the_slow_link() -> None:
    from recprof.whatif.costs import LinkFit, Network

    fit = LinkFit("all_to_all", 10.0, 100.0, 3, 1e3, 1e5)
    one_node = Network({"all_to_all": fit}, ranks_per_node=4, fitted_group=4)
    two_nodes = Network({"all_to_all": fit}, ranks_per_node=2, fitted_group=4,
                        inter_bytes_per_us=10.0)
    assert one_node.transfer_us("all_to_all", (0, 1, 2, 3), 1000.0) == pytest.approx(20.0)
    # half the peers of a 4-rank all-to-all sit on the other node: 500 B at 100, 500 B at 10
    assert two_nodes.transfer_us("all_to_all", (0, 1, 2, 3), 1000.0) == pytest.approx(65.0)
    # 2 ranks move (2-1)/2 of their message per rank, against (4-1)/4 at the fitted size
    assert two_nodes.transfer_us("all_to_all", (0, 1), 1500.0) == pytest.approx(20.0)
    assert two_nodes.transfer_us("all_to_all", (3,), 1000.0) == 0.0  # a group of one
    # the inter-node link never moves bytes faster than the hosts did in the capture
    fast = Network({"all_to_all": fit}, 2, 4, inter_bytes_per_us=1e6)
    assert fast.transfer_us("all_to_all", (0, 1, 2, 3), 1000.0) == pytest.approx(20.0)


def test_codec_cost_is_the_codecs_own_time_per_row_and_direction(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8's cost per row, each direction with its own format, is the time of the codec's own
    encode and decode of the job's rows, divided by the rows. It used to be a multiple of a
    cached gather, scaled by the capture's lookup stage: fp8's forward decode read as ~46
    gathers, about 10x its own time, and the model predicted fp8 slower than fp32 where it ran
    fastest of the grid.

    Checked as counts, not timings (this machine's speed is no test's business; the timed
    comparison is benchmarks/codec_cost.py): the clock measure_codec reads is a counter that
    only the codec's own calls advance, by a known amount per row and per format, so the cost
    must come out as exactly those amounts, and a gather or any other stand-in, which moves
    the clock not at all, would read as free."""
    torch = pytest.importorskip("torch")
    from recprof.nestpipe.config import TrainConfig
    from recprof.nestpipe.qcomms import Codec
    from recprof.whatif import device

    #: clock ticks (us) per row for each (wire format, step): e4m3 forward, e5m2 backward
    ticks = {(torch.float8_e4m3fn, "encode"): 3.0, (torch.float8_e4m3fn, "decode"): 5.0,
             (torch.float8_e5m2, "encode"): 7.0, (torch.float8_e5m2, "decode"): 11.0,
             (None, "encode"): 0.0, (None, "decode"): 0.0}
    clock = [0.0]
    rows_seen: list[int] = []
    encode, decode = Codec.encode, Codec.decode

    def timed_encode(self: Codec, rows: torch.Tensor) -> torch.Tensor:
        rows_seen.append(rows.shape[0])
        clock[0] += ticks[self.fp8, "encode"] * rows.shape[0] * 1e-6
        return encode(self, rows)

    def timed_decode(self: Codec, wire: torch.Tensor, dim: int) -> torch.Tensor:
        clock[0] += ticks[self.fp8, "decode"] * wire.shape[0] * 1e-6
        return decode(self, wire, dim)

    monkeypatch.setattr(Codec, "encode", timed_encode)
    monkeypatch.setattr(Codec, "decode", timed_decode)
    monkeypatch.setattr(device.time, "perf_counter", lambda: clock[0])
    cfg = TrainConfig(num_tables=8, num_embeddings=50_000, embedding_dim=64)
    rows = 10_000
    cost = device.measure_codec(cfg, "fp8", rows)
    assert cost.fwd == pytest.approx(3.0 + 5.0, rel=1e-9)
    assert cost.bwd == pytest.approx(7.0 + 11.0, rel=1e-9)
    assert set(rows_seen) == {rows}  # the job's own row count, not a sample of it
    free = device.measure_codec(cfg, "fp32", rows)  # fp32 sends the rows as they are
    assert free.fwd == free.bwd == 0.0


def test_a_wire_precision_says_which_all_to_alls_keep_their_size() -> None:
    """A hand-written job's all-to-alls of unknown purpose (the DDP example's counts, ids and
    forward rows) are not scaled by a wire precision: the prediction says how many and how
    many bytes, per step. TorchRec's KJT all-to-alls are known ids: no note."""
    from recprof import units
    from recprof.whatif.baseline import RankBaseline
    from recprof.whatif.scenarios import unknown_exchange_note

    def rank(bytes_by_purpose: dict[str, list[float]]) -> RankBaseline:
        return RankBaseline(0, None, 1000.0, {}, 0.0, bytes_by_purpose,
                            dict.fromkeys(bytes_by_purpose, "all_to_all"))

    steps = 5
    hand_written = rank({"unknown": [16.0, 65_536.0, 2_097_152.0] * steps,
                         "embedding_grads_bwd": [2_097_152.0] * steps})
    (note,) = unknown_exchange_note(hand_written, steps)
    per_step = units.size(16.0 + 65_536.0 + 2_097_152.0)
    assert f"unknown purpose (3 per step, {per_step} on rank 0" in note
    torchrec = rank({"kjt_splits": [48.0] * steps, "kjt_values": [6656.0] * steps,
                     "pooled_embeddings_fwd": [425_984.0] * steps})
    assert unknown_exchange_note(torchrec, steps) == []


def test_links_are_fitted_per_span_of_hosts_where_collectives_cross_several() -> None:
    """Four ranks on hosts a, a, b, b: sharding groups inside each host move 10 bytes/us,
    the all-to-all across both 1 byte/us. One line per kind would average the two; the
    spans' lines price each collective on the link its members' hosts use."""
    from recprof.whatif.costs import fit_spans

    host_of = {0: "a", 1: "a", 2: "b", 3: "b"}
    inside = [dataclasses.replace(_sample("all_to_all", b, 20 + b / 10), rank=r,
                                  process_group="intra") for b in (1e3, 1e4, 1e5) for r in (0, 2)]
    across = [dataclasses.replace(_sample("all_to_all", b, 200 + b / 1), rank=r,
                                  process_group="world") for b in (1e3, 1e4, 1e5) for r in (0, 2)]

    def members(s: CollectiveSample) -> tuple[int, ...]:
        return (s.rank, s.rank + 1) if s.process_group == "intra" else (0, 1, 2, 3)

    spans = fit_spans(inside + across, 4, members, host_of)
    assert set(spans) == {("all_to_all", ("a",)), ("all_to_all", ("b",)),
                          ("all_to_all", ("a", "b"))}
    assert spans[("all_to_all", ("a", "b"))].bytes_per_us == pytest.approx(1, rel=1e-6)
    assert spans[("all_to_all", ("b",))].latency_us == pytest.approx(20, rel=1e-6)
    network = Network(fit_links(inside + across, 4), 2, 4, spans=spans, hosts=host_of)
    assert network.fitted("all_to_all", (2, 3), 1e4) == pytest.approx(20 + 1e3, rel=1e-6)
    assert network.fitted("all_to_all", (0, 1, 2, 3), 1e4) == pytest.approx(200 + 1e4, rel=1e-6)
    # a group beyond the captured ranks (scaling) is priced on its kind's line
    assert network.line("all_to_all", (0, 4)) == network.link("all_to_all")
    # one span only: the kinds' lines are the links
    assert fit_spans([s for s in inside if s.rank == 0], 4, members, host_of) == {}
