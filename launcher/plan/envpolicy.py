"""Which environment variables travel to the ranks, and the env-file parser.

Exported: variables whose names start with one of ``EXPORT_PREFIXES``, then the env
files (``~/.deepspeed_env``, ``~/.zerorun_env``, ``./.deepspeed_env``,
``./.zerorun_env``, ``--env_file``; later wins), then ``--env K=V``. The values go to
the agents inside the plan, on stdin or in a 0600 file, never on a command line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from launcher.errors import EnvFileError

EXPORT_PREFIXES: tuple[str, ...] = (
    "NCCL_", "PYTHON", "CUDA_", "LD_LIBRARY_PATH", "HF_", "WANDB_", "TORCH_", "OMP_", "UCX_", "GLOO_", "ZERORUN_",
)
NEVER_EXPORTED = frozenset({"CUDA_VISIBLE_DEVICES", "ZERORUN_SSH_ARGS"})
"""CUDA_VISIBLE_DEVICES comes from the plan's slots; ssh args are the launcher's own."""
ENV_FILE_NAMES = (".deepspeed_env", ".zerorun_env")

_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DQ_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "$": "$", "`": "`"}


def select_exported(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that match an exported prefix."""
    return {
        k: v for k, v in environ.items() if k.startswith(EXPORT_PREFIXES) and k not in NEVER_EXPORTED
    }


def _double_quoted(body: str, where: str) -> tuple[str, str]:
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append(_DQ_ESCAPES.get(nxt, "\\" + nxt))
            i += 2
        elif ch == '"':
            return "".join(out), body[i + 1 :]
        else:
            out.append(ch)
            i += 1
    raise EnvFileError(f"{where}: unterminated double quote", 'close the value with `"`')


def _parse_value(raw: str, where: str) -> str:
    raw = raw.strip()
    if raw.startswith('"'):
        value, rest = _double_quoted(raw[1:], where)
    elif raw.startswith("'"):
        end = raw.find("'", 1)
        if end < 0:
            raise EnvFileError(f"{where}: unterminated single quote", "close the value with `'`")
        value, rest = raw[1:end], raw[end + 1 :]
    else:
        return re.split(r"\s+#", raw, maxsplit=1)[0].strip()
    rest = rest.strip()
    if rest and not rest.startswith("#"):
        raise EnvFileError(f"{where}: text {rest!r} after the closing quote", "put comments after ` #`")
    return value


def parse_env_file(text: str, source: str = "<env>") -> dict[str, str]:
    """Parse dotenv-style text: ``KEY=VALUE``, ``export`` prefixes, quotes, ``#`` comments, blanks."""
    result: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{source}:{lineno}"
        if stripped.startswith("export ") or stripped.startswith("export\t"):
            stripped = stripped[len("export") :].strip()
        key, sep, raw = stripped.partition("=")
        key = key.strip()
        if not sep or not _KEY_RE.fullmatch(key):
            raise EnvFileError(
                f"{where}: expected KEY=VALUE, got {line.strip()!r}",
                "write one `KEY=value` per line; comments start with `#`",
            )
        result[key] = _parse_value(raw, where)
    return result


def parse_env_items(items: Iterable[str]) -> dict[str, str]:
    """``--env K=V`` items (the value may contain ``=``)."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _KEY_RE.fullmatch(key):
            raise EnvFileError(f"--env {item!r}: expected KEY=VALUE", "for example --env NCCL_DEBUG=INFO")
        result[key] = value
    return result


def default_env_files(cwd: Path, home: Path) -> list[Path]:
    """Env files read by default, in increasing precedence (home, then the working directory)."""
    paths = [base / name for base in (home, cwd) for name in ENV_FILE_NAMES]
    unique: list[Path] = []
    for p in paths:
        if p not in unique:
            unique.append(p)
    return unique


def collect_env(
    environ: Mapping[str, str],
    files: Iterable[Path],
    items: Iterable[str],
    explicit_file: Path | None = None,
) -> dict[str, str]:
    """The exported environment: prefixes < default env files < ``--env_file`` < ``--env``."""
    env = select_exported(environ)
    for path in files:
        if path.is_file():
            env.update(parse_env_file(path.read_text(), str(path)))
    if explicit_file is not None:
        if not explicit_file.is_file():
            raise EnvFileError(f"--env_file {str(explicit_file)!r} does not exist", "check the path")
        env.update(parse_env_file(explicit_file.read_text(), str(explicit_file)))
    env.update(parse_env_items(items))
    return env
