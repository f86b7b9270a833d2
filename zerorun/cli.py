"""The ``zerorun`` command line.

``zerorun [launcher options] SCRIPT [script args]`` launches a training script (the
default command); ``zerorun SUBCOMMAND ...`` runs one of the tools below. Each
subcommand lives in its own module under ``zerorun/commands``; this file only wires
them together and owns the single error boundary: a usage error prints the usage and
one ``error:`` line and exits 2, a bad input prints ``error:``/``hint:`` and exits 1,
and under ``--json`` both are a JSON object on stdout. No traceback reaches the user
unless ``ZERORUN_DEBUG`` is set.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from zerorun.commands import (
    autotune,
    convert,
    doctor,
    elastic,
    estimate,
    link_deepspeed,
    print_config,
    report,
    simulate,
    validate,
)
from zerorun.commands.boundary import click_module, from_click, print_error
from zerorun.commands.help_width import WholeOptionsCommand
from zerorun.commands.options import ALIASES
from zerorun.config.suggest import did_you_mean
from zerorun.errors import UsageError, ZerorunError

if TYPE_CHECKING:
    import click

app = typer.Typer(
    name="zerorun",
    help=(
        "Train PyTorch models that do not fit in one GPU, on one machine or many.\n\n"
        "Launch:  zerorun \\[launcher options] train.py \\[script args]  "
        "(see `zerorun launch --help` for the launcher options)\n\n"
        "Every option is spelt with - or _ alike (--num-gpus = --num_gpus); "
        "every reporting command takes --json.\n\n"
        "Examples:\n\n"
        "  zerorun --num_gpus 2 examples/train_toy.py --config templates/zero2.yaml\n\n"
        "  zerorun --hostfile hostfiles/two-nodes train.py\n\n"
        "  zerorun estimate --params 14B --gpus 8\n\n"
        "  zerorun simulate --world 512 --params 70B --meta\n\n"
        "  zerorun validate ds_config.json --world-size 8\n\n"
        "  zerorun print-config templates/zero3.yaml --format table"
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_RAW = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
"""Commands whose own argparse parser reads every token (launch, autotune)."""

app.command("validate", cls=WholeOptionsCommand)(validate.command)
app.command("print-config", cls=WholeOptionsCommand)(print_config.command)
app.command("estimate", cls=WholeOptionsCommand)(estimate.command)
app.command("autotune", context_settings=_RAW, add_help_option=False)(autotune.command)
app.command("report", cls=WholeOptionsCommand)(report.command)
app.command("convert", cls=WholeOptionsCommand)(convert.command)
app.command("simulate", cls=WholeOptionsCommand)(simulate.command)
app.command("link-deepspeed", cls=WholeOptionsCommand)(link_deepspeed.command)
app.command("doctor", cls=WholeOptionsCommand)(doctor.command)
app.command("elastic", cls=WholeOptionsCommand)(elastic.command)


@app.command("launch", context_settings=_RAW, add_help_option=False)
def launch(ctx: typer.Context) -> None:
    """Launch a training script: the same as `zerorun \\[launcher options] SCRIPT \\[args]`.

    Examples:

      zerorun launch --num_gpus 2 train.py --config ds.yaml

      zerorun launch -H hostfiles/two-nodes --dry-run --json train.py
    """
    from launcher.main import main as launch_main

    raise typer.Exit(launch_main(list(ctx.args)))


def _subcommand_names() -> set[str]:
    return {info.name for info in app.registered_commands if info.name}


def route(argv: list[str]) -> tuple[str, list[str]]:
    """Decide whether ``argv`` is a subcommand call or a launch.

    A first argument that names a subcommand (or asks for help/version) goes to the
    tool app; anything else - launcher options or the script itself - is a launch.
    A first argument that is no file but is close to a subcommand name is a typo, not
    a script: it is a usage error with a "did you mean".
    """
    names = _subcommand_names()
    if not argv or argv[0] in names or argv[0] in ("-h", "--help", "--version"):
        return "app", argv
    first = argv[0]
    if not first.startswith("-") and not Path(first).exists():
        guess = did_you_mean(first, sorted(names))
        if guess is not None:
            raise UsageError(
                f"{first!r} is neither a command nor a script file (did you mean `zerorun {guess}`?)",
                hint=f"zerorun {guess} --help; `zerorun --help` lists every command",
                usage="zerorun [launcher options] SCRIPT [args]  |  zerorun COMMAND [options]",
            )
    return "launch", argv


def one_spelling(args: list[str]) -> list[str]:
    """``--hidden_size`` -> ``--hidden-size``, ``--num_gpus`` -> ``--gpus`` for the typer commands.

    The launcher's flags are DeepSpeed's (underscores) and the tools' are hyphenated;
    both spellings work everywhere, so a user never has to remember which is which.
    The shared options' other names (``options.ALIASES``) map to their one option.
    Tokens after a ``--`` are left alone.
    """
    out: list[str] = []
    for i, token in enumerate(args):
        if token == "--":
            return out + args[i:]
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            name = "--" + name[2:].replace("_", "-")
            token = ALIASES.get(name, name) + eq + value
        out.append(token)
    return out


def json_requested(kind: str, args: list[str]) -> bool:
    """Whether ``--json`` is one of the command's own options (not the script's)."""
    if kind == "app" and args and args[0] in ("launch", "autotune"):
        kind, args = args[0], args[1:]
    if kind in ("launch", "autotune"):
        from launcher.args import build_parser, split_argv

        args = split_argv(build_parser(), args)[0]
    head = args[: args.index("--")] if "--" in args else args
    return "--json" in head


def _run(kind: str, args: list[str]) -> int:
    if kind == "launch":
        from launcher.main import main as launch_main

        return launch_main(args)
    if args and args[0] == "--version":
        from zerorun import __version__

        print(f"zerorun {__version__}")
        return 0
    if args and args[0] not in ("launch", "autotune"):
        args = one_spelling(args)
    result = _command()(args=args, prog_name="zerorun", standalone_mode=False)
    return result if isinstance(result, int) else 0


@functools.cache
def _command() -> click.Command:
    """The click command of ``app``, built once: typer rebuilds it from the signatures on every call
    (about 50 ms), which every test and every fuzzed command line would pay."""
    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> int:
    """Console entry point; the one place that turns user errors into ``error:``/``hint:``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = False
    if not argv:  # `zerorun` alone: the help, and the usage error's status, as other CLIs do
        with contextlib.suppress(typer.Exit, SystemExit):
            _run("app", ["--help"])
        return 2
    try:
        kind, args = route(argv)
        as_json = json_requested(kind, args)
        return _run(kind, args)
    except ZerorunError as err:
        print_error(err, as_json=as_json)
        return err.exit_code
    except typer.Exit as done:
        return int(done.exit_code or 0)
    except typer.Abort:
        return 130
    except SystemExit as done:
        return int(done.code or 0) if isinstance(done.code, int) else 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # click's usage errors: from typer's own click (>= 0.29) or click itself
        if not isinstance(err, click_module().exceptions.ClickException):
            raise
        converted = from_click(err)
        if converted is None:  # `zerorun` alone: the help was asked for
            return 0
        print_error(converted, as_json=as_json)
        return converted.exit_code


if __name__ == "__main__":
    sys.exit(main())

