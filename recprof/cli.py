"""The `recprof` command: one typer app; each subcommand lives beside the code it drives (or in
recprof/flows where it chains several layers) and is imported only when it runs."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

import typer
from click.utils import PacifyFlushWrapper
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup
from typer.main import get_command

from recprof.errors import ExitCode, RecprofError
from recprof.terminal import ReaderGone, end_quietly_on_a_closed_pipe


def _load(name: str) -> Any:
    """The real command `name`: its module imported now, its function made a click command
    as typer makes one (options, help, no-args-is-help)."""
    spec = COMMANDS[name]
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    single.command(name=name, no_args_is_help=spec.help_without_args,
                   short_help=spec.summary)(getattr(importlib.import_module(spec.module), name))
    return get_command(single)


class _LazyGroup(TyperGroup):
    """The commands are listed by their summaries (`recprof --help`, a typo's suggestions) and
    imported only when one is invoked: importing them all cost 330 ms of `recprof --help`
    and of every command's start."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name = args[0] if args else None
        loaded = self.__dict__.setdefault("_loaded", set())
        if name in COMMANDS and name not in loaded:
            self.commands[name] = _load(name)
            loaded.add(name)
        return super().resolve_command(ctx, args)


def _listed() -> None:
    """Stands in for a command in the list `recprof --help` prints; never run (`resolve_command`
    puts the real one in its place before a command runs)."""


app = typer.Typer(
    name="recprof",
    cls=_LazyGroup,
    help=(
        "Profile, diagnose and tune distributed training of embedding-heavy recommendation "
        "models.\n\nTypical flow: `recprof capture -- torchrun ... train.py`, open the HTML "
        "report it prints, then `recprof tune` to search the knobs it points at."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    """`--version`: eager, so it answers before click asks for a subcommand."""
    if value:
        from recprof.version import __version__

        typer.echo(f"recprof {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.",
                                 callback=_print_version, is_eager=True),
) -> None:
    """Profile, diagnose and tune distributed training of embedding-heavy recommenders."""


@dataclass(frozen=True)
class Command:
    """A subcommand: the module holding its function of the same name, its line in `recprof
    --help`, and whether it prints its help when given no arguments."""

    module: str
    summary: str
    help_without_args: bool = True


#: Every subcommand, in the order `recprof --help` lists them. The summary is the menu's line,
#: so that listing the commands imports none of them (their modules pull in the analysis, the
#: report's templates, optuna and the trainer); `recprof CMD --help` shows the command's own
#: docstring.
COMMANDS: dict[str, Command] = {
    "capture": Command("recprof.flows.capture", "Run a training job with the profiler "
                       "injected into every rank, then analyze it and write the report."),
    "trigger": Command("recprof.capture.trigger", "Record a window of a running --on-demand "
                       "capture now, without restarting the job."),
    "analyze": Command("recprof.analysis.command", "Say where each rank's step time goes: "
                       "compute, exposed and hidden communication, copies, idle gaps and "
                       "their causes, collectives and stragglers."),
    "report": Command("recprof.flows.report", "Write the HTML bottleneck report of traces, a "
                      "capture or an analysis document."),
    "compare": Command("recprof.compare.command", "Compare runs: scaling, per-stage and "
                       "per-collective deltas, findings resolved and new, a regression gate."),
    "mirror": Command("recprof.mirror.command", "Write a config for the built-in trainer "
                      "shaped like a captured job."),
    "whatif": Command("recprof.whatif.command", "Predict the unprofiled step time under knob "
                      "settings from one capture, without running them."),
    "train": Command("recprof.nestpipe.command", "Train the built-in sharded-embedding DLRM "
                     "(NestPipe) with torchrun on this machine.", help_without_args=False),
    "view": Command("recprof.view.command", "Open a capture in TensorBoard's PyTorch Profiler "
                    "plugin, for op-level questions."),
    "tune": Command("tuner.command", "Search the trainer's knobs with real measured runs; "
                    "write a recommended config and report.", help_without_args=False),
}


for _name, _spec in COMMANDS.items():
    app.command(name=_name, short_help=_spec.summary)(_listed)


def main() -> None:
    """Console-script entry point: user errors become one red line and `ExitCode.USAGE`.

    A reader that closes the pipe early (`recprof analyze RUN | head`) has read what it
    wanted: every command writes its files before it prints, so the outcome stands and a
    closed pipe is not a failure (rich and click would exit 1, the status of a failed gate).
    `compare` catches `ReaderGone` itself, to end with its gate's status."""
    end_quietly_on_a_closed_pipe()
    try:
        app()
    except RecprofError as exc:
        console = Console(stderr=True, soft_wrap=True)
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(ExitCode.USAGE)
    except ReaderGone:
        sys.exit(ExitCode.OK)
    except SystemExit as exc:
        if exc.code == 1 and isinstance(sys.stdout, PacifyFlushWrapper):
            sys.exit(ExitCode.OK)  # click's own treatment of a closed pipe (click.echo)
        raise


if __name__ == "__main__":
    main()
