"""`recprof whatif RUN`: predict the step under knob settings before running them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from recprof.errors import RecprofError
from recprof.nestpipe.knobs import knobs_label

if TYPE_CHECKING:
    from recprof.whatif.predict import Scenario, WhatIf


def parse_try(text: str) -> dict[str, Any]:
    """`micro_batches=4,qcomms=fp16` -> {"micro_batches": 4, "qcomms": "fp16"} (values read as
    YAML, as `--set` reads them)."""
    out: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        if not sep or not key.strip():
            raise RecprofError(f"--try {text!r}: expected KEY=VALUE[,KEY=VALUE...]")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def whatif(
    run: Annotated[list[Path], typer.Argument(
        help="A capture run folder (or each node's, or the folder holding them), trace files "
             "or an analysis JSON of one job.",
        show_default=False)],
    tries: Annotated[list[str] | None, typer.Option(
        "--try", help="A knob setting to predict, KEY=VALUE[,KEY=VALUE...] (repeatable). "
                      "Default: every single-knob change of `recprof tune`'s default space.",
        show_default=False)] = None,
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Also write the predictions (schema recprof.whatif/1) here.")] = None,
    allow_missing_ranks: Annotated[bool, typer.Option(
        "--allow-missing-ranks", help="Predict even when a rank's trace is missing or cannot "
                                      "be read: from the ranks left, said with every "
                                      "prediction. Default: refuse, naming the rank.")] = False,
) -> None:
    """Predict the unprofiled step time under knob settings from one capture, without running
    them: the step is replayed rank by rank with the knob's changes (bytes from the job's own
    keys, links fitted on its own collectives, waits from the replay) and calibrated on the
    step logs.

    Example: recprof whatif recprof-runs/demo --try micro_batches=4 --try qcomms=fp16,dbp=true
    """
    # Imported here: `recprof --help` and every other command start without scipy and torch.
    from recprof.analysis.inputs import open_job
    from recprof.whatif.baseline import measure
    from recprof.whatif.predict import KNOWN_CHANGES, Predictor

    console = Console()
    err = Console(stderr=True, soft_wrap=True)
    changes = [parse_try(t) for t in tries] if tries else None
    for change in changes or []:  # a name that is no knob is a usage error, not a refusal
        for name in change:
            if name not in KNOWN_CHANGES:
                raise RecprofError(f"--try {name}: not a knob (one of {', '.join(KNOWN_CHANGES)})")
    with err.status("measuring the baseline and fitting the links"):
        job, gap = open_job(run, allow_missing=allow_missing_ranks, action="a prediction",
                            flag="--allow-missing-ranks")
        predictor = Predictor(measure(job))
        if gap:
            err.print(f"[yellow]warning:[/] {escape(gap)}", highlight=False)
            predictor.caveats.append(f"predicted from the ranks left only: {gap}")
        scenarios = [predictor.predict(c) for c in (changes or predictor.single_knob_changes())]
    result = predictor.report(scenarios)
    print_whatif(result, console)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_bytes(orjson.dumps(result.to_document(), option=orjson.OPT_INDENT_2))
        console.print(f"predictions written to [bold]{escape(str(json_out))}[/]", soft_wrap=True)


def print_whatif(result: WhatIf, console: Console) -> None:
    """The ranked table, then refusals and what the predictions rest on."""
    base = result.baseline_step_us
    console.print(f"baseline ({escape(knobs_label(result.baseline_knobs))}): "
                  f"{base / 1e3:.2f} ms per step"
                  + ("" if result.calibrated else " (profiled: no step logs to calibrate)"),
                  highlight=False)
    table = Table(title="predicted step per scenario (fastest first)")
    for col in ("scenario", "step ms", "samples/s", "vs baseline", "stage that moves"):
        text = col in ("scenario", "stage that moves")
        table.add_column(col, justify="left" if text else "right",
                         overflow="fold" if text else "ellipsis")
    ranked = sorted((s for s in result.scenarios if s.step_us is not None),
                    key=lambda s: s.step_us or 0.0)
    for s in ranked:
        table.add_row(*_row(s, result))
    console.print(table)
    for s in result.scenarios:
        if s.refused:
            console.print(f"[yellow]refused[/] {escape(_label(s))}: {escape(s.refused)}",
                          highlight=False, soft_wrap=True)
    console.print("[bold]links:[/] " + escape("; ".join(result.fits)), highlight=False)
    console.print("[bold]calibration:[/] " + escape(result.calibration), highlight=False)
    console.print("[bold]device:[/] " + escape(result.device), highlight=False)
    shared = {a for s in ranked for a in s.assumptions} - {result.calibration}
    for note in sorted(shared):
        console.print(f"[dim]assumes[/] {escape(note)}", highlight=False)


def _label(s: Scenario) -> str:
    return ",".join(f"{k}={v}" for k, v in s.knobs.items()) or "baseline"


def _row(s: Scenario, result: WhatIf) -> list[str]:
    step = s.step_us or 0.0
    samples = s.samples_per_step or result.samples_per_step
    rate = f"{samples / step * 1e6:,.0f}" if samples else "-"
    change = (step - result.baseline_step_us) / result.baseline_step_us
    return [escape(_label(s)), f"{step / 1e3:.2f}", rate, f"{change:+.1%}",
            escape(s.moved_stage() or "-")]
