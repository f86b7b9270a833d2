"""A seeded fuzz pass over the config reader, the validator and the config side of the command line.

Every input - a config dict of DeepSpeed's keys with values of every type (and keys a
typo away), config text mutated byte by byte from the templates in YAML and JSON, and
argument lists for `validate`, `print-config` and `estimate` - must give a result or a
clear error (a ``ZerorunError``; exit 1 or 2 at the command line with ``error:`` on
stderr), never another exception or a traceback. Seeded, so a failure replays: the
message names the seed and the input.
"""

from __future__ import annotations

import copy
import random
import warnings
from pathlib import Path
from typing import Any

import pytest

from zerorun.cli import main
from zerorun.config import load_config
from zerorun.config.keys import fields
from zerorun.config.read import parse_text
from zerorun.errors import ZerorunError

ROOT = Path(__file__).parents[2]
TEMPLATES = sorted((ROOT / "templates").glob("*.yaml"))
SEED = 28

_SCALARS: list[Any] = [0, 1, -1, 2, 3, 4, 2**31, 2**63, -(2**70), 0.5, -0.0, 1e-12, 1e300, float("inf"), float("nan"),
                       True, False, None, "", "auto", "cpu", "nvme", "none", "1e9", "5GB", "stage", "\x00", "é" * 3,
                       [], [1, 2], {}, {"a": 1}, [None], {"auto": "auto"}]


def _value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if roll < 0.75 or depth > 2:
        # a copy: random_config nests later keys into a dict it drew, which must not be the shared one
        # (a drawn {} once grew to hold itself, and validation recursed without end)
        return copy.deepcopy(rng.choice(_SCALARS))
    if roll < 0.87:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["type", "params", "lr", "device", "x"]): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _typo(rng: random.Random, key: str) -> str:
    if not key or rng.random() < 0.5:
        return key
    i = rng.randrange(len(key))
    return key[:i] + rng.choice("abcdexyz_-.") + key[i + 1:]


def random_config(rng: random.Random, paths: list[str]) -> dict[str, Any]:
    """A dict of 1-8 key paths (some misspelt) with random values, nested as the dots say."""
    out: dict[str, Any] = {}
    for path in rng.sample(paths, rng.randint(1, 8)):
        parts = [_typo(rng, p) if rng.random() < 0.1 else p for p in path.split(".")]
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[parts[-1]] = _value(rng)
    return out


# whole lines a mutation may insert: merge keys, anchors used inside themselves, aliases of aliases, deep nesting
SNIPPETS = ["  <<: *a", "b: &a {stage: 2, x: *a}", "zero_optimization: &a {stage: 1, offload_param: *a}",
            "c: &b [*a, *a, *a]", "fp16: *a", "d: " + "[" * 120 + "]" * 120, "<<: {stage: 3}", "e: &a [1, [2, *a]]"]


def mutate(rng: random.Random, text: str) -> str:
    if rng.random() < 0.3:
        lines = text.splitlines()
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(SNIPPETS))
        text = "\n".join(lines) + "\n"
    chars = list(text)
    for _ in range(rng.randint(1, 6)):
        op = rng.random()
        i = rng.randrange(len(chars) + 1)
        if op < 0.4 and chars:
            del chars[min(i, len(chars) - 1)]
        elif op < 0.8:
            chars.insert(i, rng.choice(list(":-[]{}&*<>#!|'\"\n\t ,0123456789e.") + ["  ", "<<: *a", "&a ", "*a"]))
        elif chars:
            j = rng.randrange(len(chars))
            chars[min(i, len(chars) - 1)], chars[j] = chars[j], chars[min(i, len(chars) - 1)]
    return "".join(chars)


def _check(what: str, fn: Any) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except ZerorunError:
        pass
    except Exception as e:  # noqa: BLE001 - the point: anything else is a bug, shown with its input
        pytest.fail(f"seed {SEED}: {what} raised {type(e).__name__}: {e}")


def test_random_configs_validate_or_fail_clearly() -> None:
    rng = random.Random(SEED)
    paths = list(fields()) + ["zero_optimization.stage"] * 5  # the stage steers most rules: drawn more often
    worlds = [None, 1, 2, 3, 8, 0, -1]
    for i in range(2000):
        cfg, world, hidden = random_config(rng, paths), rng.choice(worlds), rng.choice([None, 1, 4096])
        _check(f"config #{i} {cfg!r} world {world} hidden {hidden}",
               lambda cfg=cfg, world=world, hidden=hidden: load_config(cfg, world_size=world, hidden_size=hidden))


def test_mutated_config_text_reads_or_fails_clearly() -> None:
    rng = random.Random(SEED + 1)
    texts = [t.read_text() for t in TEMPLATES]
    import json

    import yaml

    texts += [json.dumps(yaml.safe_load(t), indent=1) for t in texts]
    for i in range(800):
        text = mutate(rng, rng.choice(texts))
        is_json = text.lstrip().startswith("{")

        def read(text: str = text, is_json: bool = is_json) -> None:
            data = parse_text(text, "fuzz", is_json=is_json)
            load_config(data if isinstance(data, dict) else {"x": data})

        _check(f"text #{i} {text!r}", read)


def test_config_command_lines_exit_with_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(SEED + 2)
    bad = tmp_path / "bad.yaml"
    bad.write_text("zero_optimization: &x {stage: 2, offload_param: *x}\n")
    files = [str(t) for t in TEMPLATES[:3]] + [str(bad), str(tmp_path / "missing.json"), str(tmp_path)]
    values = ["8", "0", "-3", "1e3", "14B", "7b", "0.5M", "x", "", "--", "auto", "2**40", "99999999999999999999"]
    commands = {
        "validate": ["--world-size", "--hidden-size", "--json", "--strict", "--quiet", "-q"],
        "print-config": ["--format", "--template", "--world-size", "--json", "yaml", "json", "zero3"],
        "estimate": ["--params", "--gpus", "--nodes", "--gpus-per-node", "--stage", "--json", "--offload", "--dtype"],
    }
    for _ in range(800):
        command = rng.choice(list(commands))
        argv = [command] + [rng.choice(files)] * (command != "estimate" and rng.random() < 0.8)
        for _ in range(rng.randint(0, 5)):
            argv.append(rng.choice(commands[command] + values + ["--bogus", "-x"]))
        code = main(argv)
        out, err = capsys.readouterr()
        assert code in (0, 1, 2), f"seed {SEED}: {argv} exited {code}"
        assert "Traceback" not in out + err, f"seed {SEED}: {argv}\n{err}"
        if code:
            said = "error:" in err or '"error"' in out or '"ok": false' in out
            assert said, f"seed {SEED}: {argv} exited {code} silently\n{out}{err}"
