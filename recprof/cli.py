"""The `recprof` command: one typer app whose subcommands live beside the code they drive."""

from __future__ import annotations

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


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    """Profile, diagnose and tune distributed training of embedding-heavy recommenders."""
    if version:
        from recprof import __version__

        typer.echo(f"recprof {__version__}")
        raise typer.Exit()


def _register_commands() -> None:
    """Import each subcommand where it lives, so `recprof --help` lists them all."""
    from recprof.capture.command import capture

    app.command(no_args_is_help=True)(capture)

    from recprof.analysis.command import analyze

    app.command(no_args_is_help=True)(analyze)

    from recprof.report.command import report

    app.command(no_args_is_help=True)(report)

    from recprof.compare.command import compare

    app.command(no_args_is_help=True)(compare)

    from recprof.mirror.command import mirror

    app.command(no_args_is_help=True)(mirror)

    from recprof.whatif.command import whatif

    app.command(no_args_is_help=True)(whatif)

    from recprof.nestpipe.command import train

    app.command()(train)

    from recprof.view.command import view

    app.command(no_args_is_help=True)(view)

    from tuner.command import tune

    app.command()(tune)


_register_commands()


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
