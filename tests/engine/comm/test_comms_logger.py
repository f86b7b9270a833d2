"""The communication logger (``comms_logger`` block): its own semantics, and a 2-rank run whose
records per collective agree with the engine's own counters (``engine.comm_stats()``)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from tests.dist_harness import run_distributed
from zerorun.config import load_config
from zerorun.config.problems import ConfigWarning
from zerorun.engine.comm import comms_logger as cl
from zerorun.engine.comm.comms_logger import CommsLogger, trim_mean


def test_trim_mean_trims_a_sorted_copy() -> None:
    data = [9.0, 1.0, 5.0, 2.0, 3.0, 4.0, 8.0, 6.0, 7.0, 100.0]
    assert trim_mean(data, 0.1) == pytest.approx(sum(range(2, 10)) / 8)  # 1 and 100 trimmed
    assert data[0] == 9.0 and data[-1] == 100.0
    assert trim_mean([], 0.1) == 0
    with pytest.raises(ValueError, match="trim_percent"):
        trim_mean([1.0], 1.5)


def test_flags_decide_what_is_recorded() -> None:
    log = CommsLogger()
    assert (log.enabled, log.prof_all, log.prof_ops, log.verbose, log.debug) == (False, True, [], False, False)
    log.start_profiling_comms()
    assert log.prof_all is True
    log.stop_profiling_comms()
    assert log.prof_all is False
    log.start_profiling_op(["all_reduce", "broadcast"])
    log.stop_profiling_op(["broadcast"])
    assert log.prof_ops == ["all_reduce"]
    log.record_engine_op("all_reduce", 64, 0.001)
    log.record_engine_op("all_gather", 64, 0.001)  # not profiled: prof_all off, not in prof_ops
    log.record_engine_op("all_true", 4, 0.001)  # a control message the engine does not count
    assert list(log.comms_dict) == ["all_reduce"]
    assert log.profiles("all_reduce") is False  # not enabled
    log.enabled = True
    assert log.profiles("all_reduce") and log.profiles("barrier", prof=True) and not log.profiles("barrier")


def test_bandwidths_follow_deepspeeds_formulas() -> None:
    log = CommsLogger()
    log.append("all_reduce", "all_reduce", 2.0, 1000)  # world of 1 here: busbw 0 for all-reduce
    assert log.comms_dict["all_reduce"][1000][2] == [1000 * 2 / 2.0 * 8 / 1e6]
    algbw, busbw = cl.calc_bw_log("all_gather_into_tensor", 250, 1.0, 4)
    assert (algbw, busbw) == pytest.approx((1000 * 8 / 1e6, 750 * 8 / 1e6))
    log.record_engine_op("reduce_scatter", 1000, 0.001)  # keyed by the full buffer, as comm_stats counts
    assert 1000 in log.comms_dict["reduce_scatter_tensor"]


def test_summary_keeps_the_records_paired() -> None:
    log = CommsLogger()
    for latency in (3.0, 1.0, 2.0):
        log.append("broadcast", "broadcast", latency, 512)
    before = [list(v) for v in log.get_raw_data()["broadcast"][512][1:]]
    summary = log.get_operation_summary("broadcast")
    table = log.log_all(print_log=False, return_dict=True)
    assert [list(v) for v in log.comms_dict["broadcast"][512][1:]] == before
    assert summary is not None and summary[512]["count"] == 3 and summary[512]["avg_latency_ms"] == 2.0
    assert table is not None and table["summary"]["broadcast"][512] == summary[512]
    assert log.get_operation_summary("all_reduce") is None
    assert log.get_total_operations() == 3 and log.has_data()
    log.reset_data()
    assert not log.has_data()


def test_the_block_is_read_without_a_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config({"train_batch_size": 1, "comms_logger": {"enabled": True, "prof_ops": ["all_reduce"],
                                                                   "prof_all": False, "verbose": True,
                                                                   "debug": True}})
    assert not [w for w in caught if issubclass(w.category, ConfigWarning)]
    log = CommsLogger()
    log.configure(cfg.comms_logger)
    assert (log.enabled, log.prof_all, log.prof_ops, log.verbose, log.debug) == (True, False, ["all_reduce"], True, True)


def _train(rank: int, world: int) -> list[tuple[int, dict[str, Any], dict[str, dict[int, list[Any]]]]]:
    import zerorun
    from tests.engine.test_engine_cases import global_batch, loss_fn, make_model
    from zerorun.compat import comm as dscomm

    out = []
    for stage in (3,):  # stage 3 issues all four kinds the engine counts
        cl.LOGGER.reset_data()
        cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
               "zero_optimization": {"stage": stage, "reduce_bucket_size": 60}, "comms_logger": {"enabled": True}}
        engine, _, _, _ = zerorun.initialize(model=make_model(), config=cfg)
        for step in range(1):
            x, y = global_batch(step, 2 * world)
            engine.backward(loss_fn(engine(x[rank::world]), y[rank::world]))
            engine.step()
        out.append((stage, engine.comm_stats(), {k: dict(v) for k, v in cl.LOGGER.get_raw_data().items()}))
        table = dscomm.log_summary(show_straggler=True, return_dict=True)  # deepspeed.comm's, on every rank
        assert table is not None and set(table["summary"]) == set(table["straggler_analysis"])
        assert "log_summary_barrier" in table["summary"]  # its barriers are logged, as DeepSpeed's
        engine.destroy()
    cl.LOGGER.reset_data()  # the script's own collectives: prof=, log_name=, prof_ops, debug
    dscomm.configure(prof_all=False, debug=True)
    t = torch.ones(8)
    dscomm.all_reduce(t, prof=True, log_name="mine")
    dscomm.broadcast(t, 0)  # not profiled
    cl.LOGGER.start_profiling_op(["all_gather_into_tensor"])
    dscomm.all_gather_into_tensor(torch.empty(8 * world), t, async_op=True)
    raw = cl.LOGGER.get_raw_data()
    assert sorted(raw) == ["all_gather_into_tensor | [Caller Func: _train]", "mine | [Caller Func: _train]"], raw
    assert raw["mine | [Caller Func: _train]"][32][0] == 1 and t.tolist() == [float(world)] * 8
    dscomm.configure(enabled=False, prof_all=True, debug=False, prof_ops=[])
    return out


def test_two_ranks_record_what_the_engine_counts() -> None:
    for rank_out in run_distributed(_train, 2, timeout=240):
        for stage, stats, raw in rank_out:
            kinds = {kind for kind, row in stats.items() if row["calls"]}
            assert {cl.ENGINE_NAMES[k] for k in kinds} == set(raw), (stage, stats, raw)
            for kind in kinds:
                by_size = raw[cl.ENGINE_NAMES[kind]]
                assert sum(r[0] for r in by_size.values()) == stats[kind]["calls"], (stage, kind)
                assert sum(size * r[0] for size, r in by_size.items()) == stats[kind]["bytes"], (stage, kind)
                assert all(len(r[1]) == r[0] and min(r[1]) >= 0 for r in by_size.values())
            assert kinds == set(cl.ENGINE_NAMES), stats
