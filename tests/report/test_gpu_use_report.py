"""The report's "GPU use" section (issue 46) on real sets: what it says, that its figure draws
the analysis' numbers, and that a figure the trace lacks reads "not in this trace", never 0."""

from __future__ import annotations

import html as htmllib
import re
from collections.abc import Callable
from pathlib import Path

from test_report import figures_of

from recprof.analysis import AnalysisResult
from recprof.report import write_report


def _section(html: str, name: str) -> str:
    """The text of the section whose id ends with `name` (tags stripped, entities read)."""
    match = re.search(rf'<section[^>]*id="[^"]*-{name}"[^>]*>(.*?)</section>', html, re.S)
    assert match, f"no {name} section"
    return htmllib.unescape(re.sub(r"<[^>]+>", " ", match.group(1)))


def test_sst_section_names_the_busy_ranks_and_who_they_wait_for(
        real_report: Callable[[str], Path],
        analysis_of: Callable[[str], AnalysisResult]) -> None:
    html = real_report("sst").read_text("utf-8")
    text = " ".join(_section(html, "gpu-use").split())
    # tb-profiler reads 95.7% utilization on each of the three and 12.8-12.9% SM efficiency
    # (issue 46; tests/analysis/test_gpu_use.py holds recprof to it per rank): their mean.
    assert ("Ranks 0, 1 and 3 read 95.7% utilization and 12.9% estimated SM efficiency: busy "
            "but waiting, 95% of their busy time is NCCL kernels waiting for rank 2.") in text
    assert "MFU unknown: the trace records no shapes" in text
    verdict = " ".join(_section(html, "verdict").split())
    assert "GPU use, mean over ranks: 73.0% utilization" in verdict
    # The figure draws the analysis' numbers: each rank's SM efficiency at its diamond, each
    # rank's bar summing to the whole step.
    (job,) = analysis_of("sst").jobs
    figure = next(f for k, f in figures_of(html).items() if k.endswith("-gpu-use-bars"))
    diamonds = next(t for t in figure["data"] if t["type"] == "scatter")
    assert diamonds["x"] == [round(100 * r.sm.sm_efficiency, 2) for r in job.ranks]
    bars = [t for t in figure["data"] if t["type"] == "bar"]
    for i in range(len(job.ranks)):
        assert abs(sum(t["x"][i] for t in bars) - 100.0) < 0.05


def test_rocm_reads_not_in_this_trace(analysis_of: Callable[[str], AnalysisResult],
                                      tmp_path: Path) -> None:
    result = analysis_of("tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    html = write_report(result, tmp_path / "mi300.html").read_text("utf-8")
    text = " ".join(_section(html, "gpu-use").split())
    assert "estimated CU efficiency not in this trace" in text
    assert "does not carry the launch shapes of its kernels" in text
    (row,) = re.findall(r"<tr>\s*<td[^>]*>0</td>(.*?)</tr>",
                        html.split('class="sortable gpu-use"')[1], re.S)[:1]
    cells = [htmllib.unescape(re.sub(r"<[^>]+>", "", c)).strip()
             for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert cells[1] == "not in this trace" and cells[2] == "not in this trace"  # never 0


def test_cpu_run_has_no_gpu_use_section(gloo_report: Path) -> None:
    html = gloo_report.read_text("utf-8")
    assert "-gpu-use" not in html and "GPU use" not in html


def test_h100_shared_gpu_says_each_rank_counts_its_own_kernels(
        gpu_analysis: Callable[[str], AnalysisResult], tmp_path: Path) -> None:
    """recprof's DLRM, two ranks on one H100 under MPS (../shared/gpu/SOURCES.md): the verdict
    gives MFU from the shapes (24.3 GFLOP per step, the count tests/analysis checks on
    timesliced_sync's same model) and says the two ranks share the GPU, so one rank's figures
    are not the device's; nobody is busy but waiting (rank 0 waits 29% of its step, under half
    of its busy time)."""
    result = gpu_analysis("mps_sync")
    (job,) = result.jobs
    assert [g.ranks for g in job.shared_devices] == [[0, 1]]
    html = write_report(result, tmp_path / "mps.html").read_text("utf-8")
    verdict = " ".join(_section(html, "verdict").split())
    assert "MFU 0.57% (24.3 GFLOP per step, counted over matrix products" in verdict
    assert ("Ranks 0 and 1 share one GPU: each rank's figures count only its own kernels, and "
            "the GPU ran theirs together.") in verdict
    assert "busy but waiting" not in verdict
    # MFU by hand from the job's own step and the H100 SXM5's dense FP32 peak (67 TFLOP/s).
    assert job.sm is not None and job.sm.model_flops_per_step is not None
    mean_step_s = sum(r.per_step.step for r in job.ranks) / len(job.ranks) * 1e-6
    assert job.sm.mfu is not None
    by_hand = job.sm.model_flops_per_step / (mean_step_s * 67e12)
    assert abs(job.sm.mfu - by_hand) < 1e-3 * by_hand  # the ranks' steps differ by 0.06%
