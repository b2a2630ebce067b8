"""Which framework wrote a job, from the names in its traces.

The trace layer counts, per rank, the host labels and ops that carry a framework's signature
(vocabulary.framework_sign): TorchRec's train-pipeline and sharded-module labels, the built-in
trainer's `nestpipe:*`, DDP's forward, FSDP's, Megatron's model-parallel autograd functions.
Frameworks nest (TorchRec's DistributedModelParallel wraps the dense part in DDP; the built-in
trainer is plain torch underneath), so the most specific one found wins, in `PRECEDENCE`; the
evidence lists every signature counted, so a reader can see why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from recprof.analysis.model import KnobOn
from recprof.trace.devices import of_document as device_facts
from recprof.trace.vocabulary import SETTING_MARK

#: Most specific first: a job showing several signatures is the first of them.
PRECEDENCE = ("nestpipe", "torchrec", "megatron", "fsdp", "ddp")

#: What each signature is, for the evidence line.
SIGNATURES = {
    "nestpipe": "nestpipe:* labels of the built-in trainer",
    "torchrec": "TorchRec pipeline and sharded-module labels (## forward N ##, [lookup]_..., "
                "## all2all_data:..., fbgemm TBE ops)",
    "megatron": "Megatron model-parallel autograd functions (ModelParallelRegion, "
                "VocabParallel...)",
    "fsdp": "FullyShardedDataParallel labels",
    "ddp": "DistributedDataParallel.forward calls",
}

#: How the report and the terminal name each framework.
DISPLAY_NAMES = {
    "torchrec": "TorchRec",
    "nestpipe": "recprof's built-in NestPipe trainer",
    "ddp": "PyTorch DistributedDataParallel",
    "fsdp": "PyTorch FSDP",
    "megatron": "Megatron-style tensor parallelism",
    "unknown": "no known framework",
}


def framework_line(framework: str, evidence: list[str]) -> str:
    """`Framework: TorchRec (from 230 TorchRec ... labels; 10 DistributedDataParallel...)`,
    as the terminal and the report both print it."""
    return f"Framework: {DISPLAY_NAMES.get(framework, framework)} (from {'; '.join(evidence)})"


def detect(marks: Iterable[dict[str, int]]) -> tuple[str, list[str]]:
    """(framework, evidence) from the ranks' signature counts; `unknown` when none shows."""
    total: Counter[str] = Counter()
    for rank_marks in marks:
        total.update(rank_marks)
    evidence = [f"{total[f]:,} {SIGNATURES[f]}" for f in PRECEDENCE if total[f]]
    framework = next((f for f in PRECEDENCE if total[f]), "unknown")
    if framework == "unknown":
        evidence = ["no framework's labels in the traces"]
    return framework, evidence


#: How each setting the trace shows reads in the framework's words, and which trainer knob it
#: is (vocabulary.settings_signed). The built-in trainer's own settings read as its knobs.
_SETTING_WORDS = {
    "qcomms": ("qcomms", "QCommsConfig forward/backward precision"),
    "pipeline": ("pipeline", ""),  # the value is the pipeline's class
    "compile": ("compile", "torch.compile"),
    "cuda_graphs": ("cuda_graphs", "CUDA graphs"),
}


def knobs_on_line(on: list[KnobOn]) -> str:
    """`Already on (from the trace): QCommsConfig forward/backward precision fp8; torch.compile`,
    as the terminal and the report both print it; empty when nothing shows."""
    if not on:
        return ""
    return "Already on (from the trace's labels): " + "; ".join(
        f"{k.knob}={k.value}" if k.framework_knob == k.knob else
        " ".join(w for w in (k.framework_knob, "" if k.value == "on" else k.value) if w)
        for k in on)


def knobs_on(marks: Iterable[dict[str, int]], ranks: int, steps: int,
             framework: str) -> list[KnobOn]:
    """The settings the ranks' labels show on, with how often (per rank and step); in the
    built-in trainer's job, as its own knobs."""
    total: Counter[str] = Counter()
    for rank_marks in marks:
        total.update({k[len(SETTING_MARK):]: v for k, v in rank_marks.items()
                      if k.startswith(SETTING_MARK)})
    found = []
    for setting, count in total.items():
        name, value = setting.split("=", 1)
        knob, words = ((name, name) if framework == "nestpipe"
                       else _SETTING_WORDS.get(name, (name, name)))
        per = count / max(ranks, 1) / max(steps, 1)
        found.append(KnobOn(knob=knob, value=value, framework_knob=words,
                            evidence=f"{count:,} labels that say so ({per:.3g} per rank and "
                                     "step)"))
    return sorted(found, key=lambda k: (k.knob, k.value))


# --- what to change, in each framework's own terms -------------------------------------------


#: What a finding asks for, whatever the framework calls it.
OVERLAP = "overlap"  # hide the embedding exchange behind dense compute
SHRINK = "shrink"  # fewer bytes per embedding exchange
LOCALITY = "locality"  # keep the embedding exchange inside a node (group)
BALANCE = "balance"  # even out the ranks
DENSE_COMM = "dense_comm"  # hide or shrink the dense gradient all-reduce
FEWER_EXCHANGES = "fewer_exchanges"  # fewer, larger all-to-alls
FEWER_REDUCTIONS = "fewer_reductions"  # fewer, larger all-reduces (and other collectives)
H2D = "h2d"  # hide the host-to-device copy
DATA = "data"  # feed the steps faster
LAUNCH = "launch"  # GPU: fewer, cheaper kernel launches
HOST = "host"  # CPU: less host work between ops
DEVICE = "device"  # one device per rank (ranks that share one)
HELD = "held"  # find what holds the device while launched work waits
LATE_RANK = "late_rank"  # find out why one rank arrives late (its trace may be missing)
ALLOCATOR = "allocator"  # stop the caching allocator freeing and allocating again
SYNC = "sync"  # take the host's waits for the device out of the step
HOST_WORK = "host_work"  # move CPU work off the thread that launches
UNRECORDED = "unrecorded"  # find what the host did where the trace recorded nothing


@dataclass(frozen=True)
class Remedy:
    """The knobs to turn (their names in the framework) and a sentence saying how."""

    knobs: tuple[str, ...]
    advice: str


_DATA_LOADER = Remedy(
    ("DataLoader num_workers", "DataLoader pin_memory", "DataLoader prefetch_factor"),
    "Load the next batches in worker processes (num_workers, prefetch_factor) into pinned "
    "memory (pin_memory=True).")
_GENERIC_LAUNCH = Remedy(
    ("torch.compile", "CUDA graphs"),
    "The device waits for the host to launch work: torch.compile (mode='reduce-overhead' "
    "captures CUDA graphs) or fusing small ops cuts per-kernel launch cost.")
_CPU_HOST = Remedy(
    ("torch.compile", "larger batch"),
    "The main thread spends this time between ops (Python and framework overhead): "
    "torch.compile or fewer, larger ops (a larger per-rank batch) amortise it.")
_DDP_DENSE = Remedy(
    ("DDP bucket_cap_mb", "DDP gradient_as_bucket_view", "DDP comm hook (bf16_compress_hook)",
     "DDP no_sync"),
    "DDP overlaps its all-reduce with the backward pass bucket by bucket: a smaller "
    "bucket_cap_mb starts it earlier, gradient_as_bucket_view saves the copies, a bf16 "
    "compression hook halves the bytes, and no_sync skips it on gradient-accumulation steps.")

#: The same in every framework: the device assignment is the launcher's, not the model's. Its
#: words for the device kind come from `remedy` (recprof/trace/devices.py).
_OWN_DEVICE = Remedy(
    ("one device per rank",),
    "Give every rank its own {device}: select each rank's device from its LOCAL_RANK, and "
    "check that the launcher's visible-devices setting (CUDA_VISIBLE_DEVICES and the like) "
    "does not hand every rank the same one.{sharing}")

_HELD_DEVICE = Remedy(
    (),
    "Find what holds the {device} while this job's launched work waits: another process on "
    "it (the driver's list of the {device}'s processes shows them), or a stream waiting on "
    "something outside this process (an event of another device or process, a value the host "
    "writes). recprof capture records the stream waits the profiler can show.{sharing}")

#: Wire precisions a framework can send its embedding exchange in on a device kind, where that
#: is not every one the replay knows: TorchRec's QComms on CPU sends FP16 and BF16 (as FP16)
#: and fails on FP8 (shared/docs/field-notes.md, TorchRec installs).
WIRE_PRECISIONS: dict[tuple[str, str], tuple[str, ...]] = {("torchrec", "cpu"): ("bf16", "fp16")}
#: Bits on the wire per element of each precision the findings name.
WIRE_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8}
#: The narrower precision after a 16-bit one, where a framework's device sends something other
#: than fp8: TorchRec's QComms on CPU fails on FP8 and sends INT8 (field notes).
NEXT_PRECISION: dict[tuple[str, str], str] = {("torchrec", "cpu"): "int8"}


def wire_precision_on(on: list[KnobOn]) -> str | None:
    """The narrowest wire precision the trace shows on for the embedding exchange (its codec
    labels), or None where it shows none."""
    values = [k.value for k in on if k.knob == "qcomms" and k.value in WIRE_BITS]
    return min(values, key=lambda v: WIRE_BITS[v]) if values else None


def next_precision(framework: str, device_kind: str, current: str | None) -> str | None:
    """The wire precision a finding proposes after `current` (None: the full fp32): 16 bits,
    then 8 bits (the framework's on the device), then none."""
    bits = WIRE_BITS.get(current or "fp32", 32)
    if bits > 16:
        return "bf16"
    if bits > 8:
        return NEXT_PRECISION.get((framework, device_kind), "fp8")
    return None

REMEDIES: dict[str, dict[str, Remedy]] = {
    "nestpipe": {
        OVERLAP: Remedy(("micro_batches", "dbp"),
                        "micro_batches > 1 (FWP) overlaps the all-to-all with the dense "
                        "compute of neighbouring micro-batches; dbp=true prefetches the next "
                        "batch's rows."),
        SHRINK: Remedy(("qcomms", "reshape"),
                       "qcomms=bf16/fp16/fp8 and reshape k>1 cut the bytes per lookup."),
        LOCALITY: Remedy(("hsp_groups",),
                         "hsp_groups keeps the all-to-all inside a group (inside a node) when the "
                         "job spans nodes."),
        BALANCE: Remedy(("sharding",),
                        "sharding=row (balanced, by hash) spreads hot embedding rows evenly."),
        DENSE_COMM: Remedy((), "No trainer knob changes the dense all-reduce: it is started "
                               "before the row-gradient wait already; a larger batch "
                               "amortises it."),
        FEWER_EXCHANGES: Remedy(("fuse_tables", "micro_batches"),
                                "fuse_tables=true sends one all-to-all per embedding dimension "
                                "instead of one per table; fewer micro_batches make each "
                                "larger."),
        FEWER_REDUCTIONS: Remedy((), "The trainer sends its dense gradients (and the loss) as "
                                     "one all-reduce already; a larger batch amortises it."),
        H2D: Remedy(("dbp", "pin_memory", "num_workers"),
                    "dbp=true loads the next batch (pinned with pin_memory=true) and issues its "
                    "non-blocking copy from a prefetch thread while this batch computes. The "
                    "copy goes to the default CUDA stream (no dedicated copy stream yet): it "
                    "hides the host's loading, but on a GPU it queues behind the compute "
                    "kernels already on that stream."),
        DATA: Remedy(("num_workers", "pin_memory", "dbp"),
                     "Raise num_workers, set pin_memory=true, and let dbp prefetch the next "
                     "batch."),
        # fuse_tables=true is the default: advice leads with what a default run can still
        # change (on an H100 the demo config launched ~380 kernels per 27 ms step from Python).
        LAUNCH: Remedy(("batch_size", "fuse_tables"),
                       "The trainer launches a fixed set of small kernels per step from Python: "
                       "a larger per-rank batch_size gives each launch more work; "
                       "fuse_tables=true (the default) sends one all-to-all per embedding "
                       "dimension instead of one per table."),
        DEVICE: _OWN_DEVICE,
        HELD: _HELD_DEVICE,
        HOST: Remedy(("batch_size", "fuse_tables"),
                     "A larger batch_size amortises the per-step Python work; "
                     "fuse_tables=true (the default) merges per-table work into fewer ops."),
    },
    "torchrec": {
        OVERLAP: Remedy(
            ("TrainPipelineSemiSync", "PrefetchTrainPipelineSparseDist"),
            "TrainPipelineSparseDist overlaps the next batch's input distribution, not the "
            "embedding all-to-all; TrainPipelineSemiSync (torchrec.distributed.train_pipeline."
            "train_pipelines) runs batch i+1's embedding all-to-all under batch i's dense compute "
            "(semi-synchronous: embeddings one step stale), and PrefetchTrainPipelineSparseDist "
            "prefetches embeddings from the cache ahead."),
        SHRINK: Remedy(
            ("QCommsConfig.forward_precision", "QCommsConfig.backward_precision"),
            "Quantized comms: pass qcomm_codecs_registry=get_qcomm_codecs_registry("
            "QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16)) "
            "to the EmbeddingBagCollectionSharder (on CPU, BF16 is sent as FP16)."),
        LOCALITY: Remedy(
            ("DMPCollection",),
            "2D parallel (DMPCollection) shards the tables within a group of ranks and "
            "replicates across groups, so the all-to-all stays in the group (CUDA only)."),
        BALANCE: Remedy(
            ("ShardingType", "EmbeddingShardingPlanner"),
            "Re-plan: row_wise or table_row_wise sharding spreads a hot table over ranks; give "
            "EmbeddingShardingPlanner your topology and per-table constraints "
            "(ParameterConstraints)."),
        DENSE_COMM: Remedy(
            ("DefaultDataParallelWrapper bucket_cap_mb",
             "DefaultDataParallelWrapper allreduce_comm_precision"),
            "DistributedModelParallel syncs the dense part with DDP through its data-parallel "
            "wrapper: DefaultDataParallelWrapper(bucket_cap_mb=...) starts the all-reduce earlier "
            "in backward, allreduce_comm_precision='bf16' halves its bytes."),
        FEWER_EXCHANGES: Remedy(
            ("ShardingType", "EmbeddingShardingPlanner"),
            "TorchRec already fuses the tables of one sharding type into one all-to-all: fewer "
            "sharding types (or fewer tables with distinct dims) mean fewer, larger ones."),
        FEWER_REDUCTIONS: Remedy(
            ("DefaultDataParallelWrapper bucket_cap_mb",),
            "DistributedModelParallel syncs the dense part with DDP through its data-parallel "
            "wrapper: a larger DefaultDataParallelWrapper(bucket_cap_mb=...) packs the "
            "gradients into fewer, larger all-reduces."),
        H2D: Remedy(("TrainPipelineSparseDist", "DataLoader pin_memory"),
                    "TrainPipelineSparseDist copies the next batch on its own memcpy stream; "
                    "pin the DataLoader's memory so the copy can be asynchronous."),
        DATA: _DATA_LOADER,
        LAUNCH: _GENERIC_LAUNCH,
        DEVICE: _OWN_DEVICE,
        HELD: _HELD_DEVICE,
        HOST: _CPU_HOST,
    },
    "ddp": {
        OVERLAP: Remedy(("all_to_all_single async_op",),
                        "Start the embedding all-to-all with async_op=True before dense work that "
                        "does not need it, and wait on it only where the rows are used."),
        SHRINK: Remedy(("embedding dtype on the wire",),
                       "Send the embedding rows (and their gradients) in bf16/fp16: cast before "
                       "all_to_all_single, back after."),
        LOCALITY: Remedy((), "Keep the embedding exchange inside a node: shard the tables within "
                             "a node and replicate across nodes."),
        BALANCE: Remedy(("embedding sharding",),
                        "Even out the ranks: shard hot tables by row (hash) rather than by table."),
        DENSE_COMM: _DDP_DENSE,
        FEWER_EXCHANGES: Remedy(("one all_to_all_single per exchange",),
                                "Fewer, larger all-to-alls: send every table's (or feature's) "
                                "ids in one all_to_all_single and their rows back in one, and "
                                "carry the split sizes once per step, instead of a collective "
                                "per table, feature or piece."),
        FEWER_REDUCTIONS: Remedy(("DDP bucket_cap_mb",),
                                 "A larger bucket_cap_mb packs DDP's gradients into fewer, "
                                 "larger all-reduces."),
        H2D: Remedy(("DataLoader pin_memory", "non_blocking copy"),
                    "Pin the DataLoader's memory and copy with non_blocking=True on a side "
                    "stream, one batch ahead."),
        DATA: _DATA_LOADER,
        LAUNCH: _GENERIC_LAUNCH,
        DEVICE: _OWN_DEVICE,
        HELD: _HELD_DEVICE,
        HOST: _CPU_HOST,
    },
}
#: Frameworks without their own table (FSDP, Megatron, unknown) get general PyTorch advice.
_GENERAL = {
    **REMEDIES["ddp"],
    DENSE_COMM: Remedy(("communication/computation overlap", "gradient compression"),
                       "Overlap the collective with independent compute (asynchronous "
                       "collectives, the framework's overlap options) or compress what it sends."),
    FEWER_REDUCTIONS: Remedy(("collective bucket size",),
                             "Fewer, larger collectives: raise the framework's bucket size "
                             "for gradients or parameters, or coalesce small tensors into "
                             "one call."),
}


_GENERAL[ALLOCATOR] = Remedy(
    ("{allocator_knob}=expandable_segments:True", "less memory pressure",
     "warm-up steps before recording"),
    "The host sat in the {device}'s caching allocator ({allocator_calls}): it frees its cached "
    "blocks and allocates again when memory is tight or fragmented, or while the first steps "
    "warm it up. {allocator_knob}=expandable_segments:True grows its segments instead of "
    "freeing and re-allocating; a smaller per-rank batch or activation checkpointing relieves "
    "the pressure; steps that are still warming up belong before the recorded window "
    "(recprof capture waits for settled steps by default).")
_GENERAL[SYNC] = Remedy(
    ("no .item()/.cpu()/print of device tensors in the step", "non_blocking copies"),
    "The host waited for the {device} ({host_waits}): a value read back in the step (.item(), "
    ".cpu(), printing or logging a tensor, a data-dependent shape) or an explicit synchronize "
    "stops the host until the {device} catches up, and nothing is queued meanwhile. Read such "
    "values a step later or every N steps, and copy with non_blocking=True into pinned memory.")
_GENERAL[HOST_WORK] = Remedy(
    ("DataLoader num_workers", "preprocessing in the input pipeline"),
    "The thread that launches the {device}'s work ran CPU ops that launch nothing (the ops "
    "are named in the evidence): move that work into the input pipeline (the DataLoader's "
    "worker processes) or onto the {device}, so the thread keeps the {device} fed.")
_GENERAL[UNRECORDED] = Remedy(
    ("recprof capture --with-stack", "py-spy dump --pid"),
    "The thread that launches the {device}'s work ran no op the trace recorded: Python code "
    "between ops, an I/O wait, or a wait for the GIL held by another thread, which the profiler "
    "does not tell apart. Record Python stacks (recprof capture --with-stack) or sample the "
    "thread (py-spy dump) to see which.")
_GENERAL[LATE_RANK] = Remedy(
    ("recprof capture --with-stack", "py-spy dump --pid"),
    "Nothing recorded says why the rank is late (its trace is missing, or shows no difference "
    "from the others' that explains it): profile every rank, with Python stacks (recprof "
    "capture --with-stack), or sample the late rank's threads (py-spy dump) while it lags; on "
    "a shared host, check whether its threads compete for the same cores.")

#: Where the device, not the framework, decides the knob: general PyTorch advice is in CUDA's
#: words (CUDA graphs), and an Ascend NPU job turns other knobs (torch_npu's and CANN's
#: environment: TASK_QUEUE_ENABLE, CPU_AFFINITY_CONF; graph capture through torchair or
#: torch.npu.NPUGraph). Consulted for the general remedies only: a framework's own knobs
#: (the built-in trainer's batch_size) stay what they are.
DEVICE_REMEDIES: dict[tuple[str, str], Remedy] = {
    ("npu", LAUNCH): Remedy(
        ("TASK_QUEUE_ENABLE=2", "CPU_AFFINITY_CONF=2", "torchair (torch.compile backend)",
         "torch.npu.NPUGraph"),
        "The NPU waits for the host to issue work: TASK_QUEUE_ENABLE=2 moves more of "
        "torch_npu's operator dispatch off the Python thread, CPU_AFFINITY_CONF=2 binds its "
        "dispatch threads to their own cores, and capturing the step as a graph (torch.compile "
        "with torchair's NPU backend, or torch.npu.NPUGraph) removes per-operator launches."),
    ("npu", LATE_RANK): Remedy(
        ("CPU_AFFINITY_CONF=1", "DataLoader num_workers"),
        "Profile the late rank too (torch_npu.profiler on every rank): its own trace says what "
        "delays it. On a shared host, ranks whose host threads compete for the same cores "
        "arrive late at random: CPU_AFFINITY_CONF=1 (or 2) binds each rank to the cores of its "
        "NPU's NUMA node; give its DataLoader enough workers."),
}
_DEVICE_NEUTRAL = {LAUNCH: _GENERIC_LAUNCH, LATE_RANK: _GENERAL[LATE_RANK]}


def remedy(framework: str, mechanism: str, device_kind: str,
           on: list[KnobOn] | None = None) -> Remedy:
    """The knobs and advice for `mechanism` in `framework`, in CPU words on a CPU run and in
    the device's own words where general advice depends on it (`DEVICE_REMEDIES`). `on`: the
    settings the trace shows on; a remedy never proposes turning on what is on (a switch the
    trace shows true or on is not among its knobs)."""
    chosen = _remedy(framework, mechanism, device_kind, on or [])
    switched_on = {k.knob for k in on or [] if k.value in ("true", "on")}
    if not switched_on & set(chosen.knobs):
        return chosen
    return Remedy(tuple(k for k in chosen.knobs if k not in switched_on), chosen.advice)


def _remedy(framework: str, mechanism: str, device_kind: str, on: list[KnobOn]) -> Remedy:
    current = wire_precision_on(on or [])
    if mechanism == SHRINK and current is not None:
        return _narrower(framework, device_kind, current, on or [])
    compiled = {k.knob for k in on or [] if k.knob in ("compile", "cuda_graphs")}
    if mechanism == LAUNCH and compiled and framework != "nestpipe" and device_kind != "npu":
        return _launch_with(compiled)
    table = REMEDIES.get(framework, _GENERAL)
    if mechanism in (LAUNCH, UNRECORDED) and device_kind == "cpu":
        mechanism = HOST  # on a CPU run the host is the device: time between ops
    chosen = table.get(mechanism, _GENERAL[mechanism])
    if chosen is _DEVICE_NEUTRAL.get(mechanism):
        return DEVICE_REMEDIES.get((device_kind, mechanism), chosen)
    if mechanism in _DEVICE_WORDED:
        return _in_device_words(chosen, device_kind)
    if mechanism in (DEVICE, HELD):
        words = device_facts(device_kind)
        sharing = (f" Where sharing is intended, {words.concurrent_sharing} lets the ranks' "
                   f"kernels run side by side instead of in turns."
                   if words.concurrent_sharing else "")
        return Remedy(chosen.knobs, chosen.advice.format(device=words.device, sharing=sharing))
    return chosen


#: Remedies whose words name the device and its runtime (`DeviceFacts`).
_DEVICE_WORDED = frozenset({ALLOCATOR, SYNC, HOST_WORK, UNRECORDED})


def _in_device_words(chosen: Remedy, device_kind: str) -> Remedy:
    """`chosen` with the device's words filled in: its name, its allocator's setting and
    calls, its host waits (recprof/trace/devices.py)."""
    words = device_facts(device_kind)
    fill = {"device": words.device,
            "allocator_knob": words.allocator_knob or "the allocator's setting",
            "allocator_calls": ", ".join(words.allocator_calls[:2]) or "its calls",
            "host_waits": ", ".join(sorted(words.host_waits)) or "its waits"}
    return Remedy(tuple(k.format(**fill) for k in chosen.knobs), chosen.advice.format(**fill))


def _launch_with(on: set[str]) -> Remedy:
    """LAUNCH where the trace shows torch.compile, or CUDA graphs, on already: what is left."""
    if "cuda_graphs" in on:
        return Remedy(
            ("larger per-rank batch", "capture more of the step in the graph"),
            "CUDA graphs are replayed already (cudaGraphLaunch in the trace): the launches "
            "left are outside the captured graphs; capture more of the step, or give each "
            "launch more work with a larger per-rank batch.")
    return Remedy(
        ("torch.compile(mode='reduce-overhead')", "larger per-rank batch"),
        "torch.compile is on already (its compiled regions are in the trace): "
        "mode='reduce-overhead' also captures CUDA graphs, which launch a region's kernels at "
        "once instead of one by one from the host.")


def _narrower(framework: str, device_kind: str, current: str, on: list[KnobOn]) -> Remedy:
    """SHRINK where the trace shows a wire precision on already: the next narrower one, or
    none (the bytes are as few as a precision makes them)."""
    evidence = next(k.evidence for k in on if k.knob == "qcomms" and k.value == current)
    nxt = next_precision(framework, device_kind, current)
    said = (f"{current} is already on for the embedding exchange (the trace's codec labels: "
            f"{evidence})")
    if nxt is None:
        return Remedy((), f"{said}: no narrower wire format is left; overlap the exchange or "
                          "send fewer rows instead.")
    if framework == "torchrec":
        return Remedy((f"QCommsConfig.forward_precision=CommType.{nxt.upper()}",
                       f"QCommsConfig.backward_precision=CommType.{nxt.upper()}"),
                      f"{said}; CommType.{nxt.upper()} halves those bytes again.")
    knob = "qcomms" if framework == "nestpipe" else "embedding dtype on the wire"
    return Remedy((f"{knob}={nxt}",), f"{said}; {nxt} halves those bytes again.")


def knobs_of(framework: str, device_kind: str | None = None,
             on: list[KnobOn] | None = None) -> set[str]:
    """Every knob name a finding may offer for `framework` (on `device_kind`, when given, with
    the settings `on` the trace shows)."""
    table = {**_GENERAL, **REMEDIES.get(framework, _GENERAL)}
    if device_kind is None:
        return {k for r in table.values() for k in r.knobs}
    return {k for m in table for k in remedy(framework, m, device_kind, on).knobs}


def nestpipe_config(command: list[str], cwd: str | None) -> str | None:
    """The config file a built-in-trainer job ran with, as an absolute path, when the command
    shows one and changes nothing on top of it (a `--set` would make `recprof tune --config`
    tune another job); None otherwise."""
    if "recprof.nestpipe" not in command or "--set" in command or "--config" not in command:
        return None
    at = command.index("--config") + 1
    if at >= len(command):
        return None
    path = Path(command[at])
    if not path.is_absolute() and cwd:
        path = Path(cwd) / path
    return str(path) if path.is_file() else None


# --- the built-in trainer's knobs, as each framework sets them -------------------------------
#
# `recprof tune --like` tunes the built-in trainer shaped like the user's job; its answer is
# trainer knobs. These say what each knob value is in the job's own framework (the remedies'
# vocabulary above: QCommsConfig, the planner's ParameterConstraints, DMPCollection, ...), or
# that the framework has no counterpart, with the closest lever.


@dataclass(frozen=True)
class KnobSetting:
    """One trainer knob value in a framework's own terms."""

    knob: str
    value: object
    setting: str  # what to write or change in the job
    counterpart: bool  # False: the framework cannot do what the knob does; `setting` is the
    # closest lever
    note: str = ""

    def line(self) -> str:
        """`qcomms=fp16 -> EmbeddingBagCollectionSharder(...)` (`no counterpart` said so)."""
        head = f"{self.knob}={self.value}"
        body = (self.setting if self.counterpart
                else f"no counterpart; closest lever: {self.setting}")
        return f"{head} -> {body}" + (f" ({self.note})" if self.note else "")


#: How the recommendation names each framework's terms ("in TorchRec's terms").
TERMS_NAMES = {
    "torchrec": "TorchRec's",
    "nestpipe": "the built-in trainer's",
    "ddp": "DDP with sharded embeddings'",
}
_HAND_WRITTEN = "a hand-written job's (plain torch.distributed)"

#: What TorchRec does differently on a device kind, seen here on CPU (shared/docs/field-notes.md,
#: TorchRec on these machines): the wire precisions it sends as another, the sharding types its
#: planner refuses (with the closest one it runs), and where DMPCollection (2D parallel) runs.
TORCHREC_SENT_AS = {("cpu", "bf16"): "fp16"}
TORCHREC_SHARDING_INSTEAD = {("cpu", "ROW_WISE"): "COLUMN_WISE"}
TORCHREC_2D_DEVICES = frozenset({"cuda"})

_Terms = Callable[[object, str], tuple[str, bool, str]]


def _torchrec_qcomms(value: object, device: str) -> tuple[str, bool, str]:
    precision = str(value).upper()
    sent = WIRE_PRECISIONS.get(("torchrec", device))
    where = device_facts(device).kind_name
    if value == "fp32":
        return ("QCommsConfig(forward_precision=CommType.FP32, backward_precision=CommType.FP32)"
                " (TorchRec's default: no qcomm_codecs_registry)", True, "")
    setting = ("EmbeddingBagCollectionSharder(qcomm_codecs_registry=get_qcomm_codecs_registry("
               f"QCommsConfig(forward_precision=CommType.{precision}, "
               f"backward_precision=CommType.{precision})))")
    if sent is not None and value not in sent:
        closest = setting.replace(precision, sent[-1].upper())
        return (closest, False,
                f"TorchRec's QComms {precision} fails on {where}; the closest it sends is "
                f"{sent[-1].upper()}")
    sent_as = TORCHREC_SENT_AS.get((device, str(value)))
    if sent_as is not None:
        return setting, True, f"on {where}, TorchRec sends {precision} as {sent_as.upper()}"
    if value == "fp8":
        return setting, True, "forward e4m3, backward e5m2, as TorchRec's fp8_bwd_uses_143=False"
    return setting, True, ""


def _torchrec_hsp(value: object, device: str) -> tuple[str, bool, str]:
    if value == 1:
        return "DistributedModelParallel over the whole world (as the job has it)", True, ""
    setting = (f"DMPCollection(sharding_group_size=world_size // {value}, ...): tables sharded "
               f"inside each group, replicated across the {value} groups")
    if device not in TORCHREC_2D_DEVICES:
        return ("table-wise sharding kept inside a node (ParameterConstraints per table)", False,
                f"DMPCollection (2D parallel) does not run on {device_facts(device).kind_name}")
    return (setting, True, "TorchRec syncs the replicas by averaging weights every few steps; "
            "the trainer's HSP all-reduces the touched rows' gradients every step")


def _torchrec_sharding(value: object, device: str) -> tuple[str, bool, str]:
    kind = {"row": "ROW_WISE", "table": "TABLE_WISE"}[str(value)]

    def planner(sharding: str) -> str:
        return (f"EmbeddingShardingPlanner(constraints={{table: ParameterConstraints("
                f"sharding_types=[ShardingType.{sharding}.value])}})")

    instead = TORCHREC_SHARDING_INSTEAD.get((device, kind))
    if instead is not None:
        return (planner(instead), False,
                f"TorchRec's planner refuses {kind.lower()} sharding on "
                f"{device_facts(device).kind_name}; {instead.lower()} also spreads a table over "
                "the ranks")
    return planner(kind), True, ""


_TORCHREC: dict[str, _Terms] = {
    "qcomms": _torchrec_qcomms,
    "reshape": lambda k, d: (
        f"EmbeddingBagConfig(num_embeddings=rows * {k}, embedding_dim=dim // {k}) for each table, "
        f"and the dense arch's last layer dim // {k}", True,
        "a model change: same parameters per table, 1/k of the bytes per lookup"),
    "micro_batches": lambda n, d: (
        ("TrainPipelineSparseDist (as the job has it)", True, "") if n == 1 else
        ("TrainPipelineSemiSync (torchrec.distributed.train_pipeline.train_pipelines): the next "
         "batch's embedding all-to-all runs under this batch's dense compute", False,
         "TorchRec does not split a batch into micro-batches; the semi-synchronous pipeline "
         "trains on embeddings one step stale, where the trainer's FWP trains the baseline's "
         "parameters exactly")),
    "clustering": lambda v, d: (
        ("nothing to set", True, "") if not v else
        ("order samples that share ids into the same batch in the data pipeline", False,
         "TorchRec has no micro-batches to cluster samples into")),
    "dbp": lambda v, d: (
        ("TrainPipelineSparseDist (as the job has it)", True, "") if not v else
        ("TrainPipelineSparseDist (already copies the next batch and distributes its ids during "
         "this one); to fetch its rows ahead too, TrainPipelineSemiSync or "
         "PrefetchTrainPipelineSparseDist", False,
         "no TorchRec pipeline prefetches the next batch's rows and then refreshes the ones "
         "this step's update changed; the semi-synchronous one trains on stale rows, the "
         "prefetching one serves cached (UVM) tables")),
    "hsp_groups": _torchrec_hsp,
    "sharding": _torchrec_sharding,
    "fuse_tables": lambda v, d: (
        ("nothing to set: TorchRec sends the tables of one sharding type in one all-to-all",
         True, "") if v else
        ("none (TorchRec always fuses the tables of one sharding type)", False, "")),
}


def _plain_terms(ddp: bool) -> dict[str, _Terms]:
    """The knobs as code in a job that exchanges its own embedding rows over torch.distributed
    (under DDP for the dense part, or hand-written throughout)."""
    accumulate = ("wrap all but the last micro-batch's backward in DDP's no_sync() and step "
                  "once" if ddp else "accumulate the gradients and step once")

    def qcomms(value: object, device: str) -> tuple[str, bool, str]:
        if value == "fp32":
            return "rows and gradients sent in float32 (as they are)", True, ""
        if value == "fp8":
            library = device_facts(device).collectives
            return ("send the rows as torch.float8_e4m3fn and the gradients as float8_e5m2, each "
                    "with a float32 scale per row, as a uint8 view through all_to_all_single",
                    True, f"{library} rejects float8 tensors" if library == "gloo" else "")
        dtype = {"bf16": "bfloat16", "fp16": "float16"}[str(value)]
        return (f"cast the rows to torch.{dtype} before dist.all_to_all_single and back after "
                "it, and the same for their gradients in backward", True, "")

    return {
        "qcomms": qcomms,
        "reshape": lambda k, d: (
            f"nn.EmbeddingBag(num_embeddings=rows * {k}, embedding_dim=dim // {k}) for each "
            f"table, ids mapped to rows * {k}, and the dense layers fed dim // {k}", True,
            "a model change: same parameters per table, 1/k of the bytes per lookup"),
        "micro_batches": lambda n, d: (
            ("one exchange per batch (as the job has it)", True, "") if n == 1 else
            (f"split each rank's batch into {n} micro-batches, start every micro-batch's "
             f"all_to_all_single(async_op=True) at once and run micro-batch i's dense forward "
             f"and backward while later ones travel; {accumulate}", True, "")),
        "clustering": lambda v, d: (
            ("nothing to change", True, "") if not v else
            ("reorder each batch so samples that share ids fall in the same micro-batch", True,
             "")),
        "dbp": lambda v, d: (
            ("nothing to change", True, "") if not v else
            ("load the next batch, route its ids and start its rows' all_to_all_single("
             "async_op=True) before this batch's backward; after the update, send again the "
             "rows it changed", True, "")),
        "hsp_groups": lambda m, d: (
            ("one exchange group over the whole world (as the job has it)", True, "") if m == 1
            else (f"dist.new_group for each of {m} groups of world_size // {m} ranks, each "
                  f"holding all tables sharded inside it: the all-to-all stays in the group, and "
                  f"the touched rows' gradients are all-reduced across the groups", True, "")),
        "sharding": lambda v, d: (
            ("shard rows, not tables: row r of table t on rank (r + t) % world_size", True, "")
            if v == "row" else ("each table whole on one rank (table t on rank t % world_size)",
                                True, "")),
        "fuse_tables": lambda v, d: (
            ("one all_to_all_single for every table's ids (and one for their rows) instead of "
             "one per table", True, "") if v else ("one all_to_all_single per table", True, "")),
    }


KNOB_TERMS: dict[str, dict[str, _Terms]] = {
    "torchrec": _TORCHREC,
    "ddp": _plain_terms(ddp=True),
}
_HAND_WRITTEN_TERMS = _plain_terms(ddp=False)


def terms_name(framework: str) -> str:
    """`TorchRec's`, as in "in TorchRec's terms"."""
    return TERMS_NAMES.get(framework, _HAND_WRITTEN)


def knob_setting(framework: str, knob: str, value: object, device_kind: str) -> KnobSetting:
    """What trainer knob value `knob=value` is in `framework` on `device_kind` (the analysis'
    names); the built-in trainer's own is its config key, and a key no table knows is passed
    through as a config change of the mirror."""
    if framework == "nestpipe":
        return KnobSetting(knob, value, f"{knob}: {value} in the trainer config", True)
    table = KNOB_TERMS.get(framework, _HAND_WRITTEN_TERMS)
    terms = table.get(knob)
    if terms is None:
        return KnobSetting(knob, value, f"{knob}: {value} in the mirror's trainer config", False,
                           "a trainer setting this framework has no translation for")
    setting, counterpart, note = terms(value, device_kind)
    return KnobSetting(knob, value, setting, counterpart, note)
