"""The recommendation's output (tuner/recommend.py) against values worked out here from the trials
put into the study: which trial is the search's best, the best-vs-baseline rows, the decision and
its words, the confirmation table, the next-step words, the printed summary, and the files it
writes (recommended.yaml, tuning_summary.json).

The studies are built with Optuna's own API (`create_trial`, `add_trial`), each trial's record
stored the way the tuner stores it. One study holds real runs: the built-in trainer's own
summaries of its fp32 and `qcomms=bf16` runs under MPS on an H100 and the `micro_batches=4
dbp=true` run that hung there (../shared/gpu, SOURCES.md). The others hold stated inputs (the
numbers are inputs here, not measurements), chosen to reach each decision. The confirmation's
interval is worked out by the rank-sum test's exact null distribution, enumerated here.
"""

from __future__ import annotations

import io
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState, create_trial
from rich.console import Console

from recprof.nestpipe.knobs import knobs_key
from tuner.recommend import (
    KEEP,
    RECOMMEND,
    UNCONFIRMED,
    best_vs_baseline_rows,
    confirm_rows,
    job_terms_lines,
    next_step_words,
    print_summary,
    recommend,
    write_recommendation,
)
from tuner.record import (
    ConfirmPlan,
    ConfirmRun,
    PeakMemory,
    RankMemory,
    Role,
    Status,
    StudyRecord,
    TrialRecord,
)
from tuner.trainer import Launch

#: The searched knobs (recprof/nestpipe/knobs.py) and their short labels in `knobs_label`.
SEARCHED = ("micro_batches", "hsp_groups", "qcomms", "reshape", "dbp", "clustering")
BASELINE_KNOBS = {"micro_batches": 1, "hsp_groups": 1, "qcomms": "fp32", "reshape": 1,
                  "dbp": False, "clustering": False}
TOLERANCE = 0.005
LAUNCH = Launch(nproc_per_node=2)
COMMAND = "torchrun --nproc_per_node 2 -m recprof.nestpipe --config "


def _add(study: optuna.Study, rec: TrialRecord, value: float | None,
         state: TrialState = TrialState.COMPLETE, **constraints: float) -> None:
    rec.key = knobs_key(rec.knobs or {})
    study.add_trial(create_trial(state=state, value=value, user_attrs=rec.encode(),
                                 constraints=constraints or {"quality": 0.0}))


def _study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="maximize")


def _printed(rec) -> list[str]:
    out = io.StringIO()
    print_summary(rec, Console(file=out, width=400, color_system=None))
    return out.getvalue().splitlines()


def _row(rows: list[tuple[str, str, str]], what: str) -> tuple[str, str]:
    (found,) = [(b, a) for w, b, a in rows if w == what]
    return found


# --- real runs: the built-in trainer on an H100 under MPS -----------------------------------


def _summary(shared_gpu: Path, name: str) -> dict[str, Any]:
    return json.loads((shared_gpu / name / "trainer" / "summary.json").read_text())


def test_real_runs_where_nothing_beat_the_baseline(shared_gpu: Path, tmp_path: Path) -> None:
    plain, bf16 = _summary(shared_gpu, "mps_plain"), _summary(shared_gpu, "mps_bf16")
    base_config = dict(plain["config"])
    study = _study()
    baseline = TrialRecord(role=Role.BASELINE, knobs={k: plain["config"][k] for k in SEARCHED},
                           status=Status.OK, ran=True, quality_metric="eval_auc",
                           quality_loss=0.0)
    baseline.take_summary(plain)
    _add(study, baseline, baseline.throughput)
    # bf16 on the wire: eval AUC higher (a loss below 0), so feasible under the tolerance
    loss = -(bf16["eval_auc"] - plain["eval_auc"])
    half = TrialRecord(knobs={k: bf16["config"][k] for k in SEARCHED}, status=Status.OK,
                       ran=True, quality_metric="eval_auc", quality_loss=loss)
    half.take_summary(bf16)
    _add(study, half, half.throughput, quality=loss - TOLERANCE)
    hung_reason = "hung: 40 steps not done in 90 s (NCCL watchdog: the prefetch's all-to-all)"
    _add(study, TrialRecord(knobs=BASELINE_KNOBS | {"micro_batches": 4, "dbp": True},
                            status=Status.TIMEOUT, ran=True, reason=hung_reason),
         None, TrialState.FAIL)

    rec = recommend(study, base_config, LAUNCH, TOLERANCE)
    assert rec is not None
    # the measured throughputs: fp32 283,662.7 samples/s, bf16 270,340.3; the fp32 is faster
    assert plain["throughput_samples_per_s"] > bf16["throughput_samples_per_s"]
    assert (rec.best_trial, rec.baseline_trial, rec.recommended_trial) == (0, 0, 0)
    assert rec.decision == UNCONFIRMED and rec.verdict == (
        "keep your config: no feasible config of the search ran faster (one run each; nothing "
        "to confirm)")
    assert rec.runs == 3  # the hung run was spent too
    assert rec.failures == [{"trial": 2, "status": "timeout", "reason": hung_reason}]
    rows = best_vs_baseline_rows(rec)
    fp32 = f"{plain['throughput_samples_per_s']:,.1f}"
    assert _row(rows, "throughput (samples/s)") == (fp32, fp32)
    assert _row(rows, "throughput ratio") == ("1.00x", "1.00x")
    assert _row(rows, "communication exposed (share of it)") == ("n/a (no analysis)",) * 2
    assert _row(rows, "quality delta") == ("", f"eval_auc +0.0000 (tolerance {TOLERANCE:g})")
    assert next_step_words(rec) == "your config, unchanged"

    user = tmp_path / "my_config.yaml"
    user.write_text(yaml.safe_dump(base_config))
    files = write_recommendation(rec, tmp_path / "out", user)
    assert yaml.safe_load(files["recommended"].read_text()) == base_config
    summary = json.loads(files["summary"].read_text())
    assert summary["command"] == COMMAND + str(user.resolve())
    assert (summary["decision"], summary["speedup"], summary["runs"]) == (UNCONFIRMED, 1.0, 3)
    printed = _printed(rec)
    assert "1 failed runs (kept in the study and the report)" in printed
    assert printed[-1] == f"your config, unchanged:  {COMMAND}{user.resolve()}"


# --- stated inputs: a search without a confirmation ------------------------------------------


BASE_CONFIG = {"steps": 40, "batch_size": 4096, "embedding_dim": 64, **BASELINE_KNOBS}
GIB = 1 << 30


def _searched_study() -> tuple[optuna.Study, dict[int, dict[str, Any]]]:
    """A baseline; a faster fp16 trial whose quality loss is beyond the tolerance; a lossless
    micro_batches=2 trial; its duplicate; an OOM crash; a faster trial above the memory limit;
    a slower lossless micro_batches=4 trial."""
    study = _study()
    StudyRecord(memory_limit=2 * GIB,
                pruned_knobs={"hsp_groups": "one node: no inter-node traffic to save"}
                ).save(study)
    trials = [
        # (knobs changed, samples/s, eval_auc, peak GiB, state, status, constraints)
        ({}, 1000.0, 0.7500, 1.0, TrialState.COMPLETE, Status.OK, {}),
        ({"qcomms": "fp16"}, 1400.0, 0.7300, 1.0, TrialState.COMPLETE, Status.OK,
         {"quality": 0.0200 - TOLERANCE}),
        ({"micro_batches": 2}, 1234.5, 0.7512, 1.5, TrialState.COMPLETE, Status.OK, {}),
        ({"micro_batches": 2}, 1234.5, 0.7512, 1.5, TrialState.COMPLETE, Status.DUPLICATE, {}),
        ({"micro_batches": 8}, None, None, None, TrialState.FAIL, Status.OOM, {}),
        ({"dbp": True}, 1300.0, 0.7500, 3.0, TrialState.COMPLETE, Status.OK,
         {"memory": 1.0}),
        ({"micro_batches": 4}, 1100.0, 0.7500, 1.2, TrialState.COMPLETE, Status.OK, {}),
    ]
    inputs = {}
    for number, (change, value, auc, peak, state, status, constraints) in enumerate(trials):
        knobs = BASELINE_KNOBS | change
        rec = TrialRecord(role=Role.BASELINE if number == 0 else None, knobs=knobs,
                          status=status, ran=status != Status.DUPLICATE,
                          duplicate_of=2 if status == Status.DUPLICATE else None,
                          reason="out of memory" if status == Status.OOM else None)
        if value is not None:
            rec.take_summary({"throughput_samples_per_s": value, "eval_auc": auc})
            rec.quality_metric, rec.quality_loss = "eval_auc", 0.7500 - auc
            rec.memory = PeakMemory([RankMemory(0, GIB // 2, "cuda", int(peak * GIB)),
                                     RankMemory(1, GIB // 2, "cuda", int(peak * GIB) - 1)])
        _add(study, rec, value, state, **({"quality": 0.0, "memory": 0.0} | constraints))
        inputs[number] = {"knobs": knobs, "value": value, "auc": auc, "peak": peak,
                          "state": state, "feasible": all(v <= 0 for v in constraints.values())}
    return study, inputs


def test_the_search_best_is_the_fastest_feasible_run_unconfirmed(tmp_path: Path) -> None:
    study, inputs = _searched_study()
    feasible = [n for n, t in inputs.items()
                if t["state"] == TrialState.COMPLETE and t["feasible"]]
    best = max(feasible, key=lambda n: (inputs[n]["value"], -n))
    assert best == 2  # fp16 (quality) and dbp (memory) were faster but infeasible

    rec = recommend(study, BASE_CONFIG, LAUNCH, TOLERANCE)
    assert rec is not None
    assert (rec.best_trial, rec.recommended_trial, rec.decision) == (best, best, UNCONFIRMED)
    ratio = inputs[best]["value"] / inputs[0]["value"]
    assert rec.speedup == pytest.approx(ratio, rel=1e-15)
    assert rec.verdict == (f"unconfirmed: the search's best, trial {best}, {ratio:.2f}x the "
                           "baseline in one run each; it may be noise (confirmation off or "
                           "nothing to confirm)")
    assert rec.runs == 6  # the duplicate was not run
    assert [f["trial"] for f in rec.failures] == [4]
    assert rec.config == {**BASE_CONFIG, **inputs[best]["knobs"]}
    assert (rec.peak_memory_bytes, rec.baseline_peak_memory_bytes) == (int(1.5 * GIB), GIB)

    rows = best_vs_baseline_rows(rec)
    assert _row(rows, "throughput (samples/s)") == ("1,000.0", "1,234.5")
    assert _row(rows, "throughput ratio") == ("1.00x", f"{ratio:.2f}x") == ("1.00x", "1.23x")
    delta = inputs[best]["auc"] - inputs[0]["auc"]
    assert _row(rows, "quality delta") == ("", f"eval_auc {delta:+.4f} (tolerance 0.005)")
    assert _row(rows, "knobs") == ("", "micro_batches=2 hsp_groups=1 qcomms=fp32 reshape=1 "
                                       "dbp=False clustering=False")
    assert next_step_words(rec) == "run it"

    files = write_recommendation(rec, tmp_path, tmp_path / "my_config.yaml")
    assert yaml.safe_load(files["recommended"].read_text()) == BASE_CONFIG | {"micro_batches": 2}
    summary = json.loads(files["summary"].read_text())
    assert summary["command"] == COMMAND + str(tmp_path / "recommended.yaml")
    assert summary["speedup"] == pytest.approx(ratio, rel=1e-15)
    printed = _printed(rec)
    assert "skipped hsp_groups: one node: no inter-node traffic to save" in printed
    assert "memory limit 2.0 GiB per rank; this config's peak 1.5 GiB" in printed
    assert printed[-1] == f"run it:  {COMMAND}{tmp_path / 'recommended.yaml'}"


# --- stated inputs: the confirmation's three outcomes ----------------------------------------


BASE_RUNS = [1000.0, 1010.0, 990.0, 1005.0]
FASTER_RUNS = [1200.0, 1190.0, 1215.0, 1208.0]
NO_FASTER_RUNS = [1003.0, 995.0, 1012.0, 999.0]


def _null_u(m: int, n: int) -> list[int]:
    """The rank-sum statistic U under H0, once per way of drawing n ranks of m + n."""
    return [sum(ranks) - n * (n - 1) // 2 for ranks in itertools.combinations(range(m + n), n)]


def _interval(base: list[float], cand: list[float], alpha: float) -> tuple[float, ...]:
    """Hodges-Lehmann estimate, the one-sided bounds at `alpha` and the p-value of "cand is
    larger", from the exact null distribution: the bound is the k-th smallest (largest)
    pairwise ratio, k the smallest count with P(U <= k) >= alpha."""
    ratios = sorted(c / b for c in cand for b in base)
    null = _null_u(len(base), len(cand))
    k = next(k for k in range(len(ratios)) if sum(u <= k for u in null) / len(null) >= alpha)
    observed = sum(c > b for c in cand for b in base)
    p = sum(u >= observed for u in null) / len(null)
    return statistics.median(ratios), ratios[k - 1], ratios[-k], p


def _confirmed_study(candidate: list[float], done: int | None = None,
                     **more: list[float]) -> optuna.Study:
    """The searched study confirmed: the baseline's runs BASE_RUNS, trial 2's `candidate`, and
    `trial6=...` adds trial 6 as a second candidate (`done`: only that many runs so far)."""
    study, inputs = _searched_study()
    trials = [0, 2, *(int(name.removeprefix("trial")) for name in more)]
    keys = [knobs_key(inputs[n]["knobs"]) for n in trials]
    plan = ConfirmPlan(baseline=0, candidates=trials[1:], keys=keys,
                       knobs=[inputs[n]["knobs"] for n in trials], rounds=4)
    runs = []
    for r, values in enumerate(zip(BASE_RUNS, candidate, *more.values(), strict=True), start=1):
        runs += [ConfirmRun(key, r, Status.OK, f"r{r}-{i}", v, 30, {"eval_auc": 0.75})
                 for i, (key, v) in enumerate(zip(keys, values, strict=True))]
    StudyRecord(confirm_plan=plan, confirm_runs=runs[:done]).save(study)
    return study


def _noise_pct() -> float:
    """Half the range of the baseline's confirm runs over their median, in percent."""
    return 100 * (max(BASE_RUNS) - min(BASE_RUNS)) / 2 / statistics.median(BASE_RUNS)


def test_a_confirmed_config_is_recommended_with_its_interval(tmp_path: Path) -> None:
    rec = recommend(_confirmed_study(FASTER_RUNS), BASE_CONFIG, LAUNCH, TOLERANCE)
    assert rec is not None and rec.confirmation is not None
    estimate, low, high, p = _interval(BASE_RUNS, FASTER_RUNS, 0.05)  # one candidate
    assert p == 1 / 70 and low > 1  # every candidate run beat every baseline run
    interval = f"{estimate:.3f}x [{low:.3f}x, {high:.3f}x]"
    noise = f"±{_noise_pct():.1f}%"
    assert (rec.decision, rec.recommended_trial) == (RECOMMEND, 2)
    assert rec.verdict == (f"recommended: trial 2 (N=2 M=1 q=fp32 k=1), {interval} the "
                           f"baseline's samples/s (90% interval, 4 confirm runs each; the noise "
                           f"here {noise})")
    assert confirm_rows(rec.confirmation) == [
        ["baseline (trial 0)", "N=1 M=1 q=fp32 k=1", "1,000, 1,010, 990, 1,005",
         f"{statistics.median(BASE_RUNS):,.0f}", "1.00x", "", "", "not measured",
         f"noise {noise}"],
        ["trial 2", "N=2 M=1 q=fp32 k=1", "1,200, 1,190, 1,215, 1,208",
         f"{statistics.median(FASTER_RUNS):,.0f}", interval, f"{p:.2g}", "eval_auc +0.0000",
         "not measured", f"recommended: faster beyond the noise (p = {p:.2g} < 0.05); lossless"],
    ]
    assert next_step_words(rec) == "run it"
    files = write_recommendation(rec, tmp_path, None)
    assert yaml.safe_load(files["recommended"].read_text()) == BASE_CONFIG | {"micro_batches": 2}
    conf = json.loads(files["summary"].read_text())["confirmation"]
    assert conf["complete"] is True
    assert conf["noise_pct"] == pytest.approx(_noise_pct(), rel=1e-12)
    (cand,) = conf["candidates"]
    assert [cand["speedup"], cand["low"], cand["high"]] == pytest.approx([estimate, low, high],
                                                                         rel=1e-12)


def test_the_confirmed_config_is_recommended_not_the_search_best(tmp_path: Path) -> None:
    """Two candidates: the search's best (trial 2) stays within the noise on its confirm runs,
    the slower search run (trial 6) beats the baseline on every one of its own."""
    study = _confirmed_study(NO_FASTER_RUNS, trial6=FASTER_RUNS)
    rec = recommend(study, BASE_CONFIG, LAUNCH, TOLERANCE)
    assert rec is not None and rec.confirmation is not None
    # Bonferroni over two candidates: each at 0.025, so two one-sided bounds make a 95% interval
    faster = _interval(BASE_RUNS, FASTER_RUNS, 0.025)
    slower = _interval(BASE_RUNS, NO_FASTER_RUNS, 0.025)
    assert faster[3] < 0.025 <= slower[3]
    assert (rec.best_trial, rec.decision, rec.recommended_trial) == (2, RECOMMEND, 6)
    assert rec.config == BASE_CONFIG | {"micro_batches": 4}
    interval = f"{faster[0]:.3f}x [{faster[1]:.3f}x, {faster[2]:.3f}x]"
    assert rec.verdict == (f"recommended: trial 6 (N=4 M=1 q=fp32 k=1), {interval} the "
                           f"baseline's samples/s (95% interval, 4 confirm runs each; the noise "
                           f"here ±{_noise_pct():.1f}%)")
    rows = confirm_rows(rec.confirmation)
    assert [r[0] for r in rows] == ["baseline (trial 0)", "trial 6", "trial 2"]  # by speed-up
    assert [r[4] for r in rows[1:]] == [
        interval, f"{slower[0]:.3f}x [{slower[1]:.3f}x, {slower[2]:.3f}x]"]
    files = write_recommendation(rec, tmp_path, None)
    assert yaml.safe_load(files["recommended"].read_text())["micro_batches"] == 4


def test_a_config_within_the_noise_keeps_the_users(tmp_path: Path) -> None:
    rec = recommend(_confirmed_study(NO_FASTER_RUNS), BASE_CONFIG, LAUNCH, TOLERANCE)
    assert rec is not None
    estimate, low, high, p = _interval(BASE_RUNS, NO_FASTER_RUNS, 0.05)
    assert p >= 0.05
    noise = f"±{_noise_pct():.1f}%"
    assert (rec.decision, rec.recommended_trial) == (KEEP, 0)
    assert rec.verdict == f"keep your config: no knob beat it beyond the noise ({noise} here)"
    assert rec.config == BASE_CONFIG and next_step_words(rec) == "your config, unchanged"
    user = tmp_path / "mine.yaml"
    write_recommendation(rec, tmp_path / "out", user)
    printed = _printed(rec)
    assert printed[printed.index("closest candidates:") + 1] == (
        f"  trial 2 (N=2 M=1 q=fp32 k=1): {estimate:.3f}x [{low:.3f}x, {high:.3f}x]; not "
        f"faster beyond the noise (p = {p:.2g} ≥ 0.05)")
    assert printed[-1] == f"your config, unchanged:  {COMMAND}{user.resolve()}"


def test_an_unfinished_confirmation_says_how_far_it_got() -> None:
    rec = recommend(_confirmed_study(FASTER_RUNS, done=6), BASE_CONFIG, LAUNCH, TOLERANCE)
    assert rec is not None
    assert (rec.decision, rec.recommended_trial) == (UNCONFIRMED, 2)
    assert rec.verdict == ("not confirmed yet (6 of 8 confirm runs): the search's best, trial "
                           "2, from one run; run the same command again to finish the "
                           "confirmation")


def test_a_mirrored_study_says_only_the_changed_knobs_in_the_jobs_terms(tmp_path: Path) -> None:
    study = _confirmed_study(FASTER_RUNS)
    StudyRecord(mirror_framework="torchrec", mirror_device_kind="cpu").save(study)
    rec = recommend(study, BASE_CONFIG, LAUNCH, TOLERANCE)
    assert rec is not None and rec.in_job_terms is not None
    changed = [k for k in SEARCHED if BASELINE_KNOBS[k] != rec.knobs[k]]
    assert [c.knob for c in rec.in_job_terms.changes] == changed == ["micro_batches"]
    assert next_step_words(rec) == "run the mirror"
    files = write_recommendation(rec, tmp_path, None)
    lines = json.loads(files["summary"].read_text())["in_job_terms"]["lines"]
    assert lines[0] == "in TorchRec's terms (the job this study mirrors):"
    assert len(lines) == 2 and lines[1].startswith("micro_batches=2 -> ")
    kept = _confirmed_study(NO_FASTER_RUNS)
    StudyRecord(mirror_framework="torchrec", mirror_device_kind="cpu").save(kept)
    keep = recommend(kept, BASE_CONFIG, LAUNCH, TOLERANCE)
    assert keep is not None and keep.decision == KEEP and keep.in_job_terms is not None
    assert keep.in_job_terms.changes == []  # the answer is the baseline's config
    assert job_terms_lines(keep.in_job_terms, keep.decision) == [
        "in TorchRec's terms (the job this study mirrors):", "keep the job as it is"]
