"""recprof's per-rank comm/compute overlap and idle agree with HolisticTraceAnalysis (HTA)
within 1 percentage point on every real GPU trace in ../shared/traces that HTA can analyse, and
on every rank of recprof's own H100 captures in ../shared/gpu (each run as one case: all its
node folders).

recprof and HTA do not define these numbers the same way (docs/hta-mapping.md), so the test
does not compare recprof's native numbers with HTA's directly. It starts from recprof's own
trace model and breakdown, applies HTA's definitions one at a time (window, which events count
as GPU activity, kernel classes, ns rounding), and requires the end of that chain to match what
HTA itself reports. Each case's chain is printed (`pytest -rP`) and collected in
test-artifacts/hta_crosscheck.md, so every gap between the two tools has a named cause.

HTA runs in two child processes (default options, and HTA_DISABLE_NS_ROUNDING=1 for traces
with ns timestamps), fed case by case while recprof parses the next one; its results are
cached in pytest's cache, keyed by HTA and pandas versions and the traces' sizes and mtimes.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from gpu_sets import GPU_SETS
from hta_reference import (
    HTA_DISTRIBUTION,
    HTA_VERSION,
    Case,
    ChainStep,
    HtaResult,
    HtaRun,
    RankInput,
    decode_hta,
    encode_hta,
    hta_chain,
    iter_cases,
    iter_run_cases,
    native_numbers,
)

from recprof.analysis import analyze_paths

TOLERANCE_PP = 1.0

MULTI_RANK_SETS = (
    "astra-sim_megatron-tp8/megatron-tp8",
    "hta/trace_filter",
    "torchrec_pr1460/log/resnet18",
    "torchrec_pr1460/trace/sst_long_a2a_optimizer",
    "torchrec_pr1460/trace/sst_long_a2a_optimizer_4",
)
SINGLE_RANK_GPU = (
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta/call_stack/backward_thread.json",
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "hta/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    "hta/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/execution_trace/benchmark_simple_add_trace.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta/trace_compare/base/base.json.gz",
    "hta/trace_compare/test/test.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "hta/trace_diff/test/test.json.gz",
    "hta/trace_file_list/inference_rank_1.json.gz",
    "hta/triton_example/triton_example.json.gz",
    "kineto_tb_plugin/2021-01/resnet50_num_workers_0/worker0.pt.trace.json.gz",
    "kineto_tb_plugin/2021-06/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "rocm_aorta/misc/smci350-zts-gtu-c6-25_200691.1758927066581847260.pt.trace.json",
    "tracelens/b200/eager_trace.json.gz",
    "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
    "tracelens/inference/vllm_decode_full/graph_execution.json.gz",
    "tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz",
    "tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz",
    "tracelens/mi300/resnet_act_checkpoint.json.gz",
    "tracelens/torch_compile_triton/trace.json.gz",
)
# Traces with fractional-microsecond timestamps, which HTA rounds unless told not to.
NS_TIMESTAMPS = (
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta/triton_example/triton_example.json.gz",
    "rocm_aorta/misc/smci350-zts-gtu-c6-25_200691.1758927066581847260.pt.trace.json",
    "tracelens/b200/eager_trace.json.gz",
    "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
    "tracelens/inference/vllm_decode_full/graph_execution.json.gz",
    "tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz",
    "tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz",
    "tracelens/mi300/resnet_act_checkpoint.json.gz",
    "tracelens/torch_compile_triton/trace.json.gz",
)

# recprof's own captures (../shared/gpu, SOURCES.md there): every one has ns timestamps.
CAPTURED_RUNS = tuple(f"gpu/{name}" for name in GPU_SETS)

CASE_PARAMS = [
    pytest.param(label, "default", id=f"{label}-default")
    for label in MULTI_RANK_SETS + SINGLE_RANK_GPU + CAPTURED_RUNS
] + [pytest.param(label, "ns-exact", id=f"{label}-ns-exact")
     for label in NS_TIMESTAMPS + CAPTURED_RUNS]

ARTIFACT = Path(__file__).resolve().parents[2] / "test-artifacts" / "hta_crosscheck.md"


@dataclass
class Crosscheck:
    cases: dict[str, Case]
    inputs: dict[str, RankInput]
    chains: dict[str, list[ChainStep]]  # per rank file
    hta: dict[str, HtaResult]  # per mode: "default", "ns-exact"


def _require_hta() -> None:
    if importlib.util.find_spec("hta") is None:
        pytest.skip("HTA is not installed (pip install -e '.[hta]')")
    try:
        version = importlib.metadata.version(HTA_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"the installed `hta` is not {HTA_DISTRIBUTION}; the definitions here are "
                    f"read from {HTA_DISTRIBUTION} {HTA_VERSION}")
    if version != HTA_VERSION:
        pytest.skip(f"{HTA_DISTRIBUTION} {version} installed; the definitions here are read "
                    f"from {HTA_VERSION}")


def _fingerprint(*roots: Path) -> str:
    """What HTA's results depend on: its release, pandas' (HTA fails on some traces under
    pandas 3 only), the cases and every trace file under `roots`."""
    pandas = importlib.metadata.version("pandas")
    digest = hashlib.sha256(f"{HTA_DISTRIBUTION} {HTA_VERSION} pandas {pandas} "
                            f"{CAPTURED_RUNS}".encode())
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                stat = path.stat()
                digest.update(f"{path} {stat.st_size} {stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def _all_cases(shared_traces: Path, shared_gpu: Path):  # type: ignore[no-untyped-def]
    """Every case: the public traces folder by folder, then each captured run."""
    yield from iter_cases(shared_traces)
    for label in CAPTURED_RUNS:
        name = label.removeprefix("gpu/")
        yield iter_run_cases(label, [shared_gpu / name / folder for folder in GPU_SETS[name]])


@pytest.fixture(scope="session")
def crosscheck(shared_traces: Path, shared_gpu: Path,
               request: pytest.FixtureRequest) -> Crosscheck:
    _require_hta()
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cache_key = "recprof/hta_crosscheck"
    cached = cache.get(cache_key, {}) if cache is not None else {}
    fingerprint = _fingerprint(shared_traces, shared_gpu)
    runs: dict[str, HtaRun] = {}
    if cached.get("fingerprint") != fingerprint:
        runs = {"default": HtaRun(ns_rounding=True), "ns-exact": HtaRun(ns_rounding=False)}
    cases: list[Case] = []
    inputs: dict[str, RankInput] = {}
    try:
        for case, members in _all_cases(shared_traces, shared_gpu):
            cases.append(case)
            inputs.update({m.path: m for m in members})
            if runs:
                runs["default"].send(case)
                if case.hta_rounds:
                    runs["ns-exact"].send(case)
        chains = _chains(cases, inputs)
        if runs:
            hta = {mode: run.result() for mode, run in runs.items()}
        else:
            hta = {mode: decode_hta(cached[mode]) for mode in ("default", "ns-exact")}
    except BaseException:
        for run in runs.values():
            if run.proc.returncode is None:
                run.kill()
        raise
    if runs and cache is not None:
        cache.set(cache_key, {"fingerprint": fingerprint,
                              **{m: encode_hta(r) for m, r in hta.items()}})
    return _finish(cases, inputs, chains, hta)


def _chains(cases: list[Case], inputs: dict[str, RankInput]) -> dict[str, list[ChainStep]]:
    chains: dict[str, list[ChainStep]] = {}
    for case in cases:
        step_names = set().union(*(inputs[f].step_names for f in case.files.values()))
        for f in case.files.values():
            chains[f] = hta_chain(inputs[f], len(step_names))
    return chains


def _finish(cases: list[Case], inputs: dict[str, RankInput], chains: dict[str, list[ChainStep]],
            hta: dict[str, HtaResult]) -> Crosscheck:
    result = Crosscheck({c.label: c for c in cases}, inputs, chains, hta)
    ARTIFACT.parent.mkdir(exist_ok=True)
    ARTIFACT.write_text("\n\n".join(_table(result, c.label) for c in cases) + "\n")
    return result


def _fmt(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}"


def _table(check: Crosscheck, label: str) -> str:
    """One case's mapping: recprof under each definition step, then HTA, per rank."""
    case = check.cases[label]
    lines = [f"### {label}", "", "| rank | step | overlap % | idle % |", "|---|---|---|---|"]
    for rank, f in sorted(case.files.items()):
        for step in check.chains[f]:
            lines.append(f"| {rank} | recprof, {step.label} | {_fmt(step.overlap_pct)} | "
                         f"{_fmt(step.idle_pct)} |")
        for mode, results in check.hta.items():
            value = results.get(label)
            if isinstance(value, dict) and rank in value:
                lines.append(f"| {rank} | HTA {mode} | {_fmt(value[rank].overlap_pct)} | "
                             f"{_fmt(value[rank].idle_pct)} |")
            elif isinstance(value, str):
                lines.append(f"| {rank} | HTA {mode} | failed: {value} | |")
    return "\n".join(lines)


def _agrees(recprof: float, hta: float) -> bool:
    if math.isnan(hta) or math.isnan(recprof):
        return math.isnan(hta) and math.isnan(recprof)
    return abs(recprof - hta) <= TOLERANCE_PP


def test_cases_found_are_the_listed_ones(crosscheck: Crosscheck) -> None:
    """The parametrisation below is static; a trace added to or dropped from ../shared must
    show up here rather than silently go unchecked."""
    assert sorted(crosscheck.cases) == sorted(MULTI_RANK_SETS + SINGLE_RANK_GPU + CAPTURED_RUNS)
    assert sorted(c.label for c in crosscheck.cases.values() if c.hta_rounds) == sorted(
        NS_TIMESTAMPS + CAPTURED_RUNS)
    for label in MULTI_RANK_SETS + CAPTURED_RUNS:
        if label != "gpu/one_gpu":
            assert len(crosscheck.cases[label].files) > 1, label


@pytest.mark.parametrize("label,mode", CASE_PARAMS)
def test_recprof_under_hta_definitions_matches_hta(crosscheck: Crosscheck, label: str,
                                                   mode: str) -> None:
    """mode "default": HTA as users run it, against the full chain (ns rounding included
    where HTA applies it). mode "ns-exact": HTA with HTA_DISABLE_NS_ROUNDING=1, against the
    chain before the rounding step: the definitional comparison, free of rounding artefacts."""
    case = crosscheck.cases[label]
    table = _table(crosscheck, label)
    print(table)
    hta = crosscheck.hta[mode][label]
    if isinstance(hta, str):
        pytest.skip(f"HTA cannot analyse {label} ({mode}): {hta}")
    for rank, f in sorted(case.files.items()):
        chain = crosscheck.chains[f]
        mine = chain[-1] if mode == "default" else next(
            s for s in reversed(chain) if s.label != "HTA ns rounding")
        theirs = hta[rank]
        assert _agrees(mine.overlap_pct, theirs.overlap_pct), (
            f"rank {rank} overlap: recprof {mine.overlap_pct:.2f} vs HTA "
            f"{theirs.overlap_pct:.2f}\n{table}")
        assert _agrees(mine.idle_pct, theirs.idle_pct), (
            f"rank {rank} idle: recprof {mine.idle_pct:.2f} vs HTA {theirs.idle_pct:.2f}\n{table}")


@pytest.mark.parametrize("folder", [
    "torchrec_pr1460/trace/sst_long_a2a_optimizer",
    "tracelens/inference/vllm_decode_full",
])
def test_native_numbers_are_what_recprof_reports(crosscheck: Crosscheck, shared_traces: Path,
                                                 folder: str) -> None:
    """The chain's first step is recprof's reported totals, not a re-derivation of them."""
    result = analyze_paths([shared_traces / folder])
    for job in result.jobs:
        for rank in job.ranks:
            native = native_numbers(crosscheck.inputs[rank.file].trace)
            t = rank.totals
            overlap = 100 * t.hidden_comm / t.comm if t.comm > 0 else math.nan
            assert native.overlap_pct == pytest.approx(overlap, abs=1e-9, nan_ok=True), rank.file
            assert native.idle_pct == pytest.approx(100 * t.idle / t.step, abs=1e-9), rank.file
