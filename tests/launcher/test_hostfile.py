"""launcher/plan/hostfile.py: DeepSpeed's hostfile format, and every error with file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.errors import HostfileError
from launcher.plan.hostfile import Host, find_hosts, parse_hostfile, read_hostfile


def test_parses_comments_blanks_users_ipv6_in_file_order() -> None:
    text = (
        "# cluster A\n"
        "\n"
        "worker-1 slots=4   # trailing comment\n"
        "  alice@worker-2\tslots=2\n"
        "[fe80::1] slots=1 max_slots=8\n"
        "10.0.0.7 slots=8#tight comment\n"
    )
    hosts = parse_hostfile(text, "hf")
    assert [(h.name, h.slots, h.line) for h in hosts] == [
        ("worker-1", 4, 3), ("alice@worker-2", 2, 4), ("[fe80::1]", 1, 5), ("10.0.0.7", 8, 6),
    ]
    assert [h.address for h in hosts] == ["worker-1", "worker-2", "fe80::1", "10.0.0.7"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("w0 slots=4\nw1 slots=0\n", "hf:2: slots=0 in 'w1 slots=0'"),
        ("w0 slots=-2\n", "hf:1: slots=-2"),
        ("w0 slots=4x\n", "hf:1: slots must be a whole number, got '4x'"),
        ("w0\n", "hf:1: no slots in 'w0'"),
        ("w0 slots = 4\n", "hf:1: unexpected 'slots'"),
        ("w0:4\n", "hf:1: bad host 'w0:4'"),
        ("fe80::1 slots=2\n", "hf:1: bad host 'fe80::1'"),
        ("w0 slots=4 gpus=2\n", "hf:1: unexpected 'gpus=2'"),
        ("w0 slots=1\n# x\nw0 slots=2\n", "hf:3: duplicate host 'w0' (line 3 duplicates line 1)"),
        ("# only a comment\n\n", "hf: the hostfile lists no hosts"),
        ("", "hf: the hostfile lists no hosts"),
    ],
)
def test_errors_name_file_line_and_text(text: str, needle: str) -> None:
    with pytest.raises(HostfileError) as info:
        parse_hostfile(text, "hf")
    assert needle in info.value.message
    assert info.value.hint


def test_user_and_bare_host_are_the_same_host() -> None:
    with pytest.raises(HostfileError, match="duplicate host 'bob@w0'"):
        parse_hostfile("w0 slots=1\nbob@w0 slots=1\n", "hf")


def test_missing_hostfile_is_an_error_not_a_local_fallback(tmp_path: Path) -> None:
    with pytest.raises(HostfileError, match="does not exist"):
        find_hosts(str(tmp_path / "nope"))
    with pytest.raises(HostfileError, match="does not exist"):
        read_hostfile(tmp_path / "nope")


def test_no_hostfile_and_no_default_means_local(tmp_path: Path) -> None:
    assert find_hosts(None, default=str(tmp_path / "absent")) is None
    default = tmp_path / "hostfile"
    default.write_text("n1 slots=2\n")
    assert find_hosts(None, default=str(default)) == (Host("n1", 2, 1),)


@pytest.mark.parametrize("name", ["two-nodes", "mixed-slots", "slurm"])
def test_example_hostfiles_parse(name: str) -> None:
    hosts = read_hostfile(Path(__file__).parents[2] / "hostfiles" / name)
    assert len(hosts) >= 2 and all(h.slots > 0 for h in hosts)
