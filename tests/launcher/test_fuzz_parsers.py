"""A seeded fuzz pass over the hostfile parser, the --include/--exclude filters and the
--ranks/--bind_core_list lists: every input gives a result or zerorun's own error
(file:line or flag, and a hint), never a traceback, and never an expansion past the bounds."""

from __future__ import annotations

import random
import time

from launcher.args import parse_rank_list
from launcher.errors import LaunchError
from launcher.plan.affinity import parse_core_list
from launcher.plan.filters import select
from launcher.plan.hostfile import parse_hostfile
from launcher.plan.hostnames import MAX_SLOTS

N = 3000
PIECES = ["w1", "w2", "node-3.example", "10.0.0.1", "[fe80::1]", "[::1%lo]", "bob@w1", "-Fevil", "@", ":", ",", "-",
          "[", "]", "=", "slots", "slots=", "max_slots=", "#", " ", "\t", "\n", "\r\n", "0", "1", "4", "-3", "+2",
          "8000000000", "9" * 40, "0-3", "0-99999999999", "x" * 70, "é", "٣", "\x00", "\u2028", "$(id)", "'", '"', ";",
          "..", "%h", "*", "\\", "\ufeff"]


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))


def _hostfile(rng: random.Random) -> str:
    if rng.random() < 0.5:  # mostly well-formed lines with one mutation keep the parser's deep paths busy
        lines = [f"{rng.choice(PIECES[:7])} slots={rng.choice(['1', '2', '8', '0', '9' * 12, '-1', 'x'])}"
                 for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.5:
            lines.insert(rng.randint(0, len(lines)), rng.choice(["", "# "]) + _text(rng))
        return "\n".join(lines)
    return _text(rng)


def test_the_hostfile_parser_never_raises_anything_else() -> None:
    rng, started, parsed = random.Random(28), time.monotonic(), 0
    for _ in range(N):
        text = _hostfile(rng)
        try:
            hosts = parse_hostfile(text, "hf")
        except LaunchError as e:
            assert e.message.startswith("hf") and e.hint, (text, e)
            continue
        parsed += 1
        assert all(0 < h.slots <= MAX_SLOTS and not h.name.startswith("-") for h in hosts), text
    assert parsed > N // 50 and time.monotonic() - started < 10


def test_the_filters_never_raise_anything_else() -> None:
    rng, started, selected = random.Random(30), time.monotonic(), 0
    hosts = parse_hostfile("w1 slots=4\nw2 slots=8\nnode-3.example slots=2\n[fe80::1] slots=1\n10.0.0.1 slots=2\n")
    for _ in range(N):
        spec = _text(rng) if rng.random() < 0.6 else "@".join(
            f"{rng.choice(PIECES[:5])}:{rng.choice(['0', '1-3', '0,1', '7', '0-99999999999', 'x'])}"
            for _ in range(rng.randint(1, 3)))
        flag = rng.choice(["include", "exclude"])
        try:
            nodes = select(hosts, **{flag: spec})
        except LaunchError as e:
            assert e.message and e.hint, (spec, e)
            continue
        selected += 1
        assert all(n.slots and max(n.slots) < n.host.slots for n in nodes), spec
    assert selected > N // 20 and time.monotonic() - started < 10


def test_the_rank_and_core_lists_never_raise_anything_else() -> None:
    rng, started = random.Random(32), time.monotonic()
    for _ in range(N):
        text = _text(rng) if rng.random() < 0.5 else ",".join(
            rng.choice(["0", "3", "1-2", "0-99999999999", "9" * 30, "4-1", "", "x"]) for _ in range(rng.randint(1, 4)))
        for parse in (parse_rank_list, parse_core_list):
            try:
                values = parse(text)
            except LaunchError as e:
                assert e.message and e.hint, (text, e)
                continue
            assert len(values) <= 1 << 20, text
    assert time.monotonic() - started < 10
