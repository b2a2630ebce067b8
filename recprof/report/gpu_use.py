"""The report's "GPU use" section and its line in the verdict block: how well each rank's
device was used while busy (analysis/gpu_use.py), in the words of the job's device kind.

Every number is read from the analysis (`RankAnalysis.sm`, `JobAnalysis.sm`); a figure the
trace cannot give reads "not in this trace" (or "unknown", with why), never 0.
"""

from __future__ import annotations

from recprof import units
from recprof.analysis.model import BusySplit, GpuUse, GpuUseStage, JobAnalysis
from recprof.report import figures
from recprof.report.sections import Cell, Column, Paragraph, Plot, Section, Table
from recprof.trace import devices
from recprof.trace.vocabulary import STAGE_MEANING


def _ranks(ranks: list[int]) -> str:
    shown = [str(r) for r in ranks]
    if len(shown) == 1:
        return f"rank {shown[0]}"
    return "ranks " + ", ".join(shown[:-1]) + " and " + shown[-1]


def _waiting_words(job: JobAnalysis) -> str:
    """`Ranks 0, 1 and 3 read 95.7% utilization and 12.8% estimated SM efficiency: busy but
    waiting, 95% of their busy time is NCCL kernels waiting for rank 2.` (empty when no rank
    is). Their own figures, not the job's means: the mean over ranks mixes them with the late
    rank's idle device and hides what a dashboard shows for them."""
    use = job.sm
    if use is None or not use.busy_waiting_ranks:
        return ""
    words = devices.of_document(job.device_kind)
    waiting = [r for r in job.ranks if r.rank in use.busy_waiting_ranks and r.sm is not None
               and r.sm.busy_split is not None]
    wait = sum(r.sm.busy_split.comm_waiting_us for r in waiting)  # type: ignore[union-attr]
    busy = sum(r.sm.busy_split.busy_us for r in waiting)  # type: ignore[union-attr]
    late = _ranks(use.waited_for) if use.waited_for else "each other"
    lead = _ranks(use.busy_waiting_ranks)
    util = sum(r.sm.gpu_utilization for r in waiting) / len(waiting)  # type: ignore[union-attr]
    sm = [r.sm.sm_efficiency for r in waiting if r.sm is not None
          and r.sm.sm_efficiency is not None]
    read = f"{units.fraction(util)} utilization"
    if sm:
        read += (f" and {units.fraction(sum(sm) / len(sm))} estimated "
                 f"{words.compute_unit or 'unit'} efficiency")
    return (f" {lead[0].upper()}{lead[1:]} read {read}: busy but waiting, "
            f"{units.percent(wait, busy)} of their busy time is {words.collectives} {words.work} "
            f"waiting for {late}.")


def gpu_use_headline(job: JobAnalysis) -> str | None:
    """The verdict block's line: utilization, SM efficiency, occupancy, MFU (or why unknown),
    the compute imbalance, and the ranks that are busy but waiting."""
    use = job.sm
    if use is None:
        return None
    words = devices.of_document(job.device_kind)
    text = (f"{words.device} use, mean over ranks: {units.fraction(use.gpu_utilization)} "
            f"utilization ({words.work} running), estimated {words.compute_unit or 'unit'} "
            f"efficiency {units.fraction(use.sm_efficiency)}, estimated occupancy "
            f"{units.fraction(use.achieved_occupancy)}")
    if use.mfu is not None and use.model_flops_per_step is not None:
        text += (f"; MFU {_mfu(use.mfu)} ({units.flop(use.model_flops_per_step)} per step, "
                 f"counted over matrix products, attention and convolution)")
    else:
        text += f"; MFU {use.mfu_note or 'unknown'}"
    if use.compute_imbalance is not None:
        text += f"; compute imbalance across ranks {100 * use.compute_imbalance:.1f}%"
    return text + "." + _shared_words(job, words.device) + _waiting_words(job)


def _shared_words(job: JobAnalysis, device: str) -> str:
    """Where ranks share one physical device, each rank's figures count its own kernels only,
    while the device ran them all: one rank's MFU or utilization is not the device's."""
    groups = [g.ranks for g in job.shared_devices]
    if not groups:
        return ""
    who = "; ".join(_ranks(g) for g in groups)
    return (f" {who[0].upper()}{who[1:]} share one {device}"
            f"{' each' if len(groups) > 1 else ''}: each rank's figures count only its own "
            f"kernels, and the {device} ran theirs together.")


def _mfu(value: float) -> str:
    """MFU as a percentage, with two significant figures below 1% (an embedding-heavy job's
    dense part is often far below it)."""
    return f"{100 * value:.2g}%" if value < 0.01 else f"{100 * value:.1f}%"


def _fraction_cell(value: float | None, missing: str = "not in this trace") -> Cell:
    return Cell(units.fraction(value, missing), sort=value if value is not None else -1.0,
                css="num")


def _busy_cells(split: BusySplit | None, step: float) -> list[Cell]:
    if split is None:
        return [Cell("–", sort=-1.0, css="num")] * 4
    return [Cell(units.ms_cell(us), sort=us / 1000, sub=f"{units.share(us, step):.1f}%",
                 css="num")
            for us in (split.compute_us, split.comm_moving_us, split.comm_waiting_us,
                       split.copy_us + split.other_us)]


def _flops_cells(flops: float | None, mfu: float | None, note: str) -> list[Cell]:
    if flops is None:
        return [Cell("unknown", sort=-1.0, css="num"), Cell("unknown", sort=-1.0, css="num")]
    if flops == 0:  # none of the counted ops ran there
        return [Cell("–", sort=0.0, css="num"), Cell("–", sort=0.0, css="num")]
    return [Cell(units.flop(flops), sort=flops, css="num"),
            Cell(_mfu(mfu) if mfu is not None else "unknown",
                 sort=mfu if mfu is not None else -1.0, css="num",
                 sub=None if mfu is not None else note.removeprefix("unknown: ")[:60])]


def _lookup_cell(use: GpuUse) -> Cell:
    if use.lookup_bytes_per_s is None:
        return Cell("–", sort=-1.0, css="num")
    share = use.lookup_bandwidth_share
    return Cell(f"{use.lookup_bytes_per_s / 1e9:.0f}", sort=use.lookup_bytes_per_s, css="num",
                sub=f"{100 * share:.0f}% of peak" if share is not None else None)


def _rank_table(job: JobAnalysis) -> Table:
    rows = []
    for r in sorted(job.ranks, key=lambda r: r.rank):
        use = r.sm
        if use is None:
            continue
        rows.append([
            Cell(str(r.rank), sort=r.rank),
            _fraction_cell(use.gpu_utilization), _fraction_cell(use.sm_efficiency),
            _fraction_cell(use.achieved_occupancy),
            *_busy_cells(use.busy_split, r.per_step.step),
            *_flops_cells(use.model_flops_per_step, use.mfu, use.mfu_note),
            _lookup_cell(use),
        ])
    words = devices.of_document(job.device_kind)
    unit = words.compute_unit or "unit"
    return Table(
        columns=[Column("rank"), Column("utilization", True), Column(f"{unit} efficiency", True),
                 Column("occupancy", True), Column("compute ms", True),
                 Column("comm moving ms", True), Column("comm waiting ms", True),
                 Column("copies, other ms", True), Column("FLOP/step", True),
                 Column("MFU", True), Column("lookup GB/s", True)],
        rows=rows, css="gpu-use",
        note=_rank_note(words, unit, any(r.sm is not None and r.sm.launch_args
                                         for r in job.ranks)))


def _rank_note(words: devices.DeviceFacts, unit: str, estimates: bool) -> str:
    """The rank table's definitions, in the device's own words (`words.work`: "kernels",
    "NPU tasks"); the efficiency and occupancy ones only where the trace has them."""
    work = words.work
    shape = (f" {unit} efficiency: each of the {work}' blocks per {unit} (its grid over the "
             f"{unit} count), summed over concurrent {work}, capped at 1, weighted by time "
             f"over the step; occupancy: Kineto's estimate per launch, weighted by its time "
             f"(all three with tb-profiler's definitions; estimates from the launch shape, not "
             f"hardware counters)." if estimates else "")
    return (f"Per rank over the analysed steps. Utilization: the time any of its {work} runs "
            f"over the step.{shape} The busy time (step minus idle) is split like the "
            f"breakdown, with the communication {work}' time split into waiting for peers "
            f"(the blocking wait at matched collectives) and moving data; % of the step "
            f"below. FLOP/step: executed FLOPs of matrix products, attention and convolution "
            f"from the recorded shapes (recomputation counts); MFU holds them to the "
            f"device's dense datasheet peak for their precision. Lookup GB/s: the bytes the "
            f"embedding lookups' shapes say they move over their {work}' time, against the "
            f"memory bandwidth. Definitions: docs/analysis.md.")


def _stage_row(name: str, stage: GpuUseStage, estimates: bool) -> list[Cell]:
    small = stage.small_kernel_us_per_step
    split = stage.busy_split
    return [
        Cell(name, css="name whole", sub=STAGE_MEANING.get(name)),
        _fraction_cell(stage.gpu_utilization),
        *([_fraction_cell(stage.sm_efficiency), _fraction_cell(stage.achieved_occupancy)]
          if estimates else []),
        Cell(units.ms_cell(stage.compute_us_per_step), sort=stage.compute_us_per_step / 1000,
             css="num"),
        Cell(units.ms_cell(split.comm_waiting_us) if split else "–",
             sort=split.comm_waiting_us / 1000 if split else -1.0, css="num"),
        *_flops_cells(stage.model_flops_per_step, stage.mfu, ""),
        *([Cell(units.ms_cell(small) if stage.small_kernel_fill is not None else "–",
                sort=small / 1000, css="num",
                sub=(f"fill {100 * stage.small_kernel_fill:.0f}%"
                     if stage.small_kernel_fill is not None else None))] if estimates else []),
    ]


def _stage_table(job: JobAnalysis, estimates: bool) -> Table | None:
    """The stages' figures; without the launch estimates (`estimates` False: the section
    says they are not in this trace) their three columns are left out rather than filled with
    the same words on every row."""
    use = job.sm
    if use is None or not use.stages:
        return None
    words = devices.of_document(job.device_kind)
    unit, work = words.compute_unit or "unit", words.work
    columns = [Column("stage"), Column("utilization", True),
               *([Column(f"{unit} efficiency", True), Column("occupancy", True)]
                 if estimates else []),
               Column("compute ms/step", True), Column("waiting ms/step", True),
               Column("FLOP/step", True), Column("MFU share", True),
               *([Column("small kernels ms/step", True)] if estimates else [])]
    share = (f"utilization and {unit} efficiency are its part of the rank's (stages overlap, so "
             f"they need not add up), occupancy its {work}' own" if estimates else
             "utilization is its part of the rank's (stages overlap, so they need not add up)")
    small = (f" Small kernels: its compute kernels with fewer blocks than the device has "
             f"{unit}s (under one block per {unit}), per step, and how much of the {unit}s "
             f"their grids fill, time-weighted." if estimates else "")
    return Table(
        columns=columns,
        rows=[_stage_row(name, st, estimates) for name, st in use.stages.items()],
        css="gpu-stages", heading="By stage (mean over ranks)",
        note=(f"Each stage's {work} over the whole step: {share}; MFU share is its FLOPs at "
              f"the peak over the step (the shares add up to the MFU). Waiting: the rank's "
              f"blocking wait at matched collectives (no compute of its own under it) shared "
              f"out by its collectives' waits in each stage; the stages table's \"of it "
              f"waiting\" counts those collectives' whole wait, so the two can differ "
              f"slightly.{small}"))


def gpu_use_section(job: JobAnalysis, anchor: str, figs: dict) -> Section | None:
    """The section, or None on a job without device use (a CPU run)."""
    use = job.sm
    if use is None:
        return None
    words = devices.of_document(job.device_kind)
    blocks: list = [Paragraph((gpu_use_headline(job) or "").replace(
        f"{words.device} use, mean over ranks: ", "Mean over ranks: ", 1))]
    estimates = any(r.sm is not None and r.sm.launch_args for r in job.ranks)
    if not estimates:
        blocks.append(Paragraph(
            f"This trace does not carry the launch shapes of its {words.work}, so "
            f"{words.compute_unit or 'unit'} efficiency and occupancy are not in this trace; "
            f"utilization is.", css="note"))
    info = figures.gpu_use_info(job, words)
    if info is not None:
        figs[f"{anchor}-gpu-use-bars"] = figures.plot_gpu_use(info)
        blocks.append(Plot(f"{anchor}-gpu-use-bars", heading="What each rank's busy time served",
                           note="% of the step" + (
                               f"; the diamond is the rank's estimated "
                               f"{words.compute_unit or 'unit'} efficiency on the same scale. "
                               f"A long bar with the diamond far to its left: the "
                               f"{words.device} is busy without filling its "
                               f"{words.compute_unit or 'unit'}s." if estimates else ".")))
    blocks.append(_rank_table(job))
    stages = _stage_table(job, estimates)
    if stages is not None:
        blocks.append(stages)
    return Section(f"{anchor}-gpu-use", f"{words.device} use: busy, and doing what", blocks)
