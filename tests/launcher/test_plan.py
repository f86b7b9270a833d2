"""launcher/plan/filters.py and launcher/plan/launch_plan.py: the include/exclude grammar, the node and
slot limits (every error with its message), and the rank layout and env of a plan."""

from __future__ import annotations

import pytest

from launcher.errors import FilterError
from launcher.plan.filters import NodeSlots, check_exclusive, limit, parse_filter, select
from launcher.plan.hostfile import Host, parse_hostfile
from launcher.plan.launch_plan import AgentOptions, DeviceMode, LaunchPlan, build_plan, rank_argv, rank_env

HOSTS = parse_hostfile("w0 slots=4\nbob@w1 slots=2\n[fe80::1] slots=4\n", "hf")


def _slots(nodes: tuple[NodeSlots, ...]) -> list[tuple[str, tuple[int, ...]]]:
    return [(n.host.address, n.slots) for n in nodes]


def test_filter_grammar_merges_specs_and_expands_ranges() -> None:
    assert parse_filter("w0:0,1@w1") == {"w0": {0, 1}, "w1": None}
    assert parse_filter("w0:0-2,5@w0:7") == {"w0": {0, 1, 2, 5, 7}}
    assert parse_filter("[fe80::1]:1-2") == {"[fe80::1]": {1, 2}}


def test_include_keeps_hostfile_order_and_slot_subsets() -> None:
    with pytest.raises(FilterError):  # a bare IPv6 address is ambiguous: brackets are required
        select(HOSTS, include="fe80::1:0")
    assert _slots(select(HOSTS, include="[fe80::1]:3@w0:1-2")) == [("w0", (1, 2)), ("fe80::1", (3,))]
    assert _slots(select(HOSTS, include="w1")) == [("w1", (0, 1))]
    assert _slots(select(HOSTS, include="w1:1")) == [("w1", (1,))]


def test_exclude_removes_hosts_or_slots() -> None:
    assert _slots(select(HOSTS, exclude="w0@[fe80::1]:0-2")) == [("w1", (0, 1)), ("fe80::1", (3,))]
    assert _slots(select(HOSTS)) == [("w0", (0, 1, 2, 3)), ("w1", (0, 1)), ("fe80::1", (0, 1, 2, 3))]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"include": "w0", "exclude": "w1"}, "--include and --exclude are mutually exclusive"),
        ({"include": "w9:0"}, "--include: host 'w9' is not in the hostfile"),
        ({"exclude": "w9"}, "--exclude: host 'w9' is not in the hostfile"),
        ({"include": "w1:2"}, "--include: slot 2 of host 'w1' is out of range (it has slots=2, ids 0-1)"),
        ({"exclude": "w0:0-9"}, "--exclude: slot 4 of host 'w0' is out of range"),
        ({"include": "w0:3-1"}, "--include 'w0:3-1': range '3-1' runs backwards"),
        ({"include": "w0:a"}, "--include 'w0:a': bad slot 'a'"),
        ({"include": "w0:"}, "--include 'w0:': bad slot ''"),
        ({"include": "w0@"}, "--include 'w0@': bad entry ''"),
        ({"exclude": "w0@w1@[fe80::1]"}, "--exclude 'w0@w1@[fe80::1]' leaves no hosts and no slots"),
        ({"include": " "}, "--include is empty"),
    ],
)
def test_filter_errors(kwargs: dict[str, str], needle: str) -> None:
    with pytest.raises(FilterError) as info:
        select(HOSTS, **kwargs)
    assert needle in info.value.message
    assert info.value.hint


def test_num_nodes_and_num_gpus_trim_and_reject_too_large() -> None:
    nodes = select(HOSTS)
    assert _slots(limit(nodes, num_nodes=2, num_gpus=2)) == [("w0", (0, 1)), ("w1", (0, 1))]
    with pytest.raises(FilterError, match=r"--num_nodes 4 is larger than the 3 node\(s\) available"):
        limit(nodes, num_nodes=4)
    with pytest.raises(FilterError, match=r"--num_gpus 3 is larger than the 2 slot\(s\) available on 'w1'"):
        limit(nodes, num_gpus=3)
    with pytest.raises(FilterError, match="--num_nodes 0: needs at least 1"):
        limit(nodes, num_nodes=0)
    with pytest.raises(FilterError, match="--include and --num_gpus cannot be combined"):
        check_exclusive("w0", None, None, 2)


def _plan(nodes: tuple[NodeSlots, ...], **kw: object) -> LaunchPlan:
    return build_plan(nodes, command=["py", "-u", "train.py", "--lr", "1"], job_id="j1", cwd="/w", python="py",
                      env={"NCCL_DEBUG": "INFO"}, **kw)  # type: ignore[arg-type]


def test_plan_layout_with_different_slot_counts() -> None:
    nodes = select(parse_hostfile("a slots=2\nb slots=4\nc slots=1\n"), exclude="b:0")
    plan = _plan(nodes)
    assert plan.world_size == 6
    assert [(n.host, n.node_rank, n.slots, n.ranks) for n in plan.nodes] == [
        ("a", 0, (0, 1), (0, 1)), ("b", 1, (1, 2, 3), (2, 3, 4)), ("c", 2, (0,), (5,)),
    ]
    assert (plan.master_addr, plan.master_port) == ("a", 29500)
    assert "first node of the hostfile (a)" in plan.master_reason
    env = rank_env(plan, 1, 2, has_gpu=True)  # global rank 4: third on node b
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                                "CROSS_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG")} == {
        "RANK": "4", "LOCAL_RANK": "2", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "3", "NODE_RANK": "1",
        "GROUP_RANK": "1", "CROSS_RANK": "1", "MASTER_ADDR": "a", "MASTER_PORT": "29500",
        "CUDA_VISIBLE_DEVICES": "1,2,3", "NCCL_DEBUG": "INFO",
    }
    assert "CUDA_VISIBLE_DEVICES" not in rank_env(plan, 1, 2, has_gpu=False)


def test_master_choice_and_reason() -> None:
    nodes = select(HOSTS)
    plan = _plan(nodes, master_addr="10.1.1.1", master_port=1234, port_reason="auto: a free port on this machine")
    assert (plan.master_addr, plan.master_port) == ("10.1.1.1", 1234)
    assert plan.master_reason == "given by --master_addr; port auto: a free port on this machine"
    assert _plan(select(HOSTS, include="w1")).master_addr == "w1"  # user@ stripped
    local = _plan(select((Host("localhost", 2),)), local=True)
    assert (local.master_addr, local.master_reason) == ("127.0.0.1", "single local node: loopback")


def test_script_arguments_untouched_and_local_rank_opt_in() -> None:
    nodes = select(HOSTS, include="w1")
    assert rank_argv(_plan(nodes), 1) == ["py", "-u", "train.py", "--lr", "1"]
    assert rank_argv(_plan(nodes, pass_local_rank=True), 1) == ["py", "-u", "train.py", "--lr", "1", "--local_rank=1"]


def test_plan_round_trips_through_json() -> None:
    import json

    opts = AgentOptions(kill_timeout=2.5, log_dir="/logs", console_ranks=(0, 2), color=True, devices=DeviceMode.GPU)
    plan = _plan(select(HOSTS), options=opts)
    assert LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
