"""The ``zerorun`` command line.

``zerorun [launcher options] SCRIPT [script args]`` launches a training script (the
default command); ``zerorun SUBCOMMAND ...`` runs one of the tools below. Each
subcommand lives in its own module under ``zerorun/commands``; this file only wires
them together and owns the single error boundary.
"""

from __future__ import annotations

import os
import sys

import typer

from zerorun.commands import autotune, convert, estimate, print_config, report, validate
from zerorun.errors import ZerorunError

app = typer.Typer(
    name="zerorun",
    help=(
        "Train PyTorch models that do not fit in one GPU, on one machine or many.\n\n"
        "Launch:  zerorun \\[launcher options] train.py \\[script args]  "
        "(see `zerorun launch --help` for the launcher options)\n\n"
        "Examples:\n\n"
        "  zerorun --num_gpus 2 examples/train_toy.py --config templates/zero2.yaml\n\n"
        "  zerorun --hostfile hostfiles/two-nodes train.py\n\n"
        "  zerorun estimate --params 14B --gpus 8\n\n"
        "  zerorun validate ds_config.json --world-size 8\n\n"
        "  zerorun print-config templates/zero3.yaml --format table"
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)

app.command("validate")(validate.command)
app.command("print-config")(print_config.command)
app.command("estimate")(estimate.command)
app.command(
    "autotune",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,  # its own parser prints the launcher + autotune options
)(autotune.command)
app.command("report")(report.command)
app.command("convert")(convert.command)


@app.command(
    "launch",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def launch(ctx: typer.Context) -> None:
    """Launch a training script: the same as `zerorun [launcher options] SCRIPT [args]`."""
    from launcher.main import main as launch_main

    raise typer.Exit(launch_main(list(ctx.args)))


def _subcommand_names() -> set[str]:
    return {info.name for info in app.registered_commands if info.name}


def route(argv: list[str]) -> tuple[str, list[str]]:
    """Decide whether ``argv`` is a subcommand call or a launch.

    A first argument that names a subcommand (or asks for help/version) goes to the
    tool app; anything else - launcher options or the script itself - is a launch.
    """
    if not argv or argv[0] in _subcommand_names() or argv[0] in ("-h", "--help", "--version"):
        return "app", argv
    return "launch", argv


def main(argv: list[str] | None = None) -> int:
    """Console entry point; the one place that turns user errors into ``error:``/``hint:``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        kind, args = route(argv)
        if kind == "launch":
            from launcher.main import main as launch_main

            return launch_main(args)
        if args and args[0] == "--version":
            from zerorun import __version__

            print(f"zerorun {__version__}")
            return 0
        result = app(args=args, prog_name="zerorun", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except ZerorunError as err:
        _print_error(err)
        return 1
    except typer.Exit as done:
        return int(done.exit_code or 0)
    except SystemExit as done:
        return int(done.code or 0) if isinstance(done.code, int) else 1
    except Exception as err:  # click's usage errors and friends
        import click

        if isinstance(err, click.exceptions.ClickException):
            err.show()
            return err.exit_code
        if isinstance(err, click.exceptions.Abort):
            return 130
        raise


def _print_error(err: ZerorunError) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True, highlight=False)
    # escape: messages carry brackets of their own ("[rank 0]", "pip install 'zerorun[plot]'")
    console.print(f"[bold red]error:[/] {escape(err.message)}", markup=True, soft_wrap=True)
    if err.hint:
        console.print(f"[bold cyan]hint:[/] {escape(err.hint)}", markup=True, soft_wrap=True)
    if os.environ.get("ZERORUN_DEBUG"):
        import traceback

        traceback.print_exception(err)


if __name__ == "__main__":
    sys.exit(main())
