"""The `recprof` command: one typer app whose subcommands live beside the code they drive."""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console
from rich.markup import escape

from recprof.errors import RecprofError

app = typer.Typer(
    name="recprof",
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
        from recprof import __version__

        typer.echo(f"recprof {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.",
                                 callback=_print_version, is_eager=True),
) -> None:
    """Profile, diagnose and tune distributed training of embedding-heavy recommenders."""


#: Each subcommand, the module holding its function of the same name, and whether it prints
#: its help when given no arguments.
COMMANDS: dict[str, tuple[str, bool]] = {
    "capture": ("recprof.capture.command", True),
    "trigger": ("recprof.capture.trigger", True),
    "analyze": ("recprof.analysis.command", True),
    "report": ("recprof.report.command", True),
    "compare": ("recprof.compare.command", True),
    "mirror": ("recprof.mirror.command", True),
    "whatif": ("recprof.whatif.command", True),
    "train": ("recprof.nestpipe.command", False),
    "view": ("recprof.view.command", True),
    "tune": ("tuner.command", False),
}


def _register_commands(argv: list[str]) -> None:
    """Import the subcommand `argv` names, or every one (`recprof --help` lists them all).
    Importing them all cost ~60 ms of every command's start (jinja2, optuna's, the report's
    and the trainer's modules), most of a small trace's `recprof analyze`."""
    named = argv[1] if len(argv) > 1 else None
    for name in [named] if named in COMMANDS else COMMANDS:
        module, help_without_args = COMMANDS[name]
        command = getattr(importlib.import_module(module), name)
        app.command(no_args_is_help=help_without_args)(command)


_register_commands(sys.argv)


def main() -> None:
    """Console-script entry point: user errors become one red line and exit status 2."""
    try:
        app()
    except RecprofError as exc:
        console = Console(stderr=True, soft_wrap=True)
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
