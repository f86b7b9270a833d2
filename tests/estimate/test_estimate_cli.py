"""`zerorun estimate` end to end through the CLI: JSON schema, table, errors, config, plot."""

from __future__ import annotations

import json
import sys

import pytest

from zerorun.cli import main
from zerorun.estimate import EstimateRequest, GiB, ModelShape, Training, estimate

ROW_KEYS = {
    "stage", "offload_optimizer", "offload_param", "per_gpu_bytes", "per_node_cpu_bytes",
    "per_node_nvme_bytes", "model_states_bytes", "fits",
}
GPU_KEYS = {"params", "gradients", "optimizer_states", "buffers", "activations", "total"}


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["estimate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_schema_and_the_card_example(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "--params", "14B", "--gpus", "8", "--gpu-memory", "80GB")
    assert (data["params"], data["gpus"], data["nodes"]) == (14 * 10**9, 8, 1)
    assert len(data["rows"]) == 8
    for row in data["rows"]:
        assert set(row) >= ROW_KEYS
        assert set(row["per_gpu_bytes"]) >= GPU_KEYS
        assert all(isinstance(v, int) for v in row["per_gpu_bytes"].values())
        assert isinstance(row["fits"], bool)
        assert (row["per_gpu_bytes"]["total"] <= data["usable_bytes"]) == row["fits"]
    assert data["usable_bytes"] == int(80 * 2**30 * (1 - data["fit_headroom"]))  # an "80 GB" card: 80 GiB
    plain = {r["stage"]: r["model_states_bytes"] for r in data["rows"] if r["offload_optimizer"] == "none"}
    assert plain == {0: 224 * 10**9, 1: 77 * 10**9, 2: 56 * 10**9, 3: 31_500_000_000}  # the engine's layout
    paper = data["paper_reference"]["model_states_bytes"]
    assert paper == {"0": 224 * 10**9, "1": 77 * 10**9, "2": 52_500_000_000, "3": 28 * 10**9}
    assert "Fig. 1" in data["paper_reference"]["source"]
    rec = data["recommendation"]
    assert {"stage", "offload_optimizer", "offload_param", "reason"} <= set(rec)
    assert rec["stage"] in (0, 1, 2, 3) and rec["reason"]


def test_fits_is_null_without_gpu_memory(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU here (or pretend so): NVML is the only other source of the GPU's size.
    monkeypatch.setattr("zerorun.commands.estimate.local_gpus", lambda: (0, None))
    data = _json(capsys, "--params", "7B", "--gpus", "2")
    assert all(row["fits"] is None for row in data["rows"])
    assert data["recommendation"]["stage"] is None


def test_nvml_memory_is_used_when_no_flag(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Mocked: this machine has no GPU for NVML to report.
    monkeypatch.setattr("zerorun.commands.estimate.local_gpus", lambda: (4, 40 * 2**30))
    data = _json(capsys, "--params", "7B")
    assert data["gpus"] == 4 and data["gpu_memory_bytes"] == 40 * 2**30
    assert all(isinstance(row["fits"], bool) for row in data["rows"])


def test_model_config_gives_params_and_activations(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 11008,
        "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False,
    }))
    data = _json(capsys, "--model", str(config), "--gpus", "8", "--seq-len", "4096")
    assert data["params"] == 6_738_415_616
    plain = data["rows"][0]["per_gpu_bytes"]["activations"]
    flash = _json(capsys, "--model", str(config), "--gpus", "8", "--seq-len", "4096", "--flash-attention")
    ckpt = _json(capsys, "--model", str(config), "--gpus", "8", "--seq-len", "4096", "--activation-checkpointing")
    assert plain > flash["rows"][0]["per_gpu_bytes"]["activations"] > ckpt["rows"][0]["per_gpu_bytes"]["activations"] > 0


def test_config_buckets_change_the_buffers(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "ds.yaml"
    cfg.write_text("zero_optimization:\n  stage: 2\n  reduce_bucket_size: 1000\n  allgather_bucket_size: 3000\n  overlap_comm: false\n")
    data = _json(capsys, "--params", "1B", "--gpus", "2", "--config", str(cfg), "--offload-optimizer", "none")
    stage2 = next(r for r in data["rows"] if r["stage"] == 2)
    assert stage2["per_gpu_bytes"]["buffers"] == 1000 * 4  # one fp32 staging bucket (no bf16/fp16 block)
    assert next(r for r in data["rows"] if r["stage"] == 1)["per_gpu_bytes"]["buffers"] == 0
    assert data["dtype"] == "fp32"


def test_offload_flag_pins_the_rows(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "--params", "14B", "--gpus", "8", "--offload-optimizer", "nvme", "--offload-param", "cpu")
    assert [(r["stage"], r["offload_optimizer"], r["offload_param"]) for r in data["rows"]] == [(3, "nvme", "cpu")]
    row = data["rows"][0]
    assert row["per_node_nvme_bytes"] == 8 * 16 * 14 * 10**9 // 8  # master, moments, fp32 gradient shard
    # the parameter shard and the host's gradient accumulator (pinned, written as reductions land)
    assert row["per_node_cpu_bytes"] == 8 * (2 + 4) * 14 * 10**9 // 8
    assert row["per_gpu_bytes"]["params"] == 0 and row["per_gpu_bytes"]["optimizer_states"] == 0
    assert row["per_gpu_bytes"]["gradients"] == 0


def test_table_output_names_units_and_recommends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--params", "14B", "--gpus", "8", "--gpu-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "GiB (2^30 bytes)" in out and "recommended:" in out
    assert "opt:cpu par:cpu" in out and "│" in out  # the GPU-memory line in the bars


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--params", "fourteen"], "cannot read the parameter count"),
        (["--gpus", "8"], "needs the parameter count"),
        (["--params", "7B", "--hidden", "4096"], "--layers, --heads"),
        (["--params", "7B", "--gpu-memory", "80 furlongs"], "cannot read the size"),
        (["--params", "7B", "--model", "/nonexistent/config.json"], "no such file"),
    ],
)
def test_bad_input_is_an_error_with_a_hint(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and "hint:" in err


def test_plot_without_matplotlib_says_how_to_install(tmp_path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importing it now raises ImportError
    assert main(["estimate", "--params", "7B", "--gpus", "2", "--plot", str(tmp_path / "m.png")]) == 1
    err = capsys.readouterr().err
    assert "matplotlib" in err and "zerorun[plot]" in err


def test_plot_rejects_other_formats(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--params", "7B", "--plot", str(tmp_path / "m.jpg")]) == 1
    assert ".png or .svg" in capsys.readouterr().err


def test_plot_writes_an_svg(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the optional extra 'plot' is not installed")
    out = tmp_path / "m.svg"
    assert main(["estimate", "--params", "7B", "--gpus", "2", "--gpu-memory", "80GB", "--plot", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("<?xml") and "GPU memory" in text


def test_activation_assumptions_are_shown_and_follow_the_model(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
                                  "vocab_size": 1000, "max_position_embeddings": 4096}))
    data = _json(capsys, "--model", str(config), "--gpus", "2", "--micro-batch", "2")
    assert data["activations"] == {"seq_len": 4096, "micro_batch": 2, "activation_checkpointing": False,
                                   "flash_attention": False}
    assert _json(capsys, "--model", str(config), "--gpus", "2", "--seq-len", "512")["activations"]["seq_len"] == 512
    assert _json(capsys, "--params", "1B", "--gpus", "2")["activations"] is None  # no shape: not counted
    assert main(["estimate", "--model", str(config), "--gpus", "2"]) == 0
    assert "sequence length 4096 (max_position_embeddings) x micro batch 1" in capsys.readouterr().out


def test_a_bare_gpu_memory_is_gib(capsys: pytest.CaptureFixture[str]) -> None:
    assert _json(capsys, "--params", "1B", "--gpu-memory", "80")["gpu_memory_bytes"] == 80 * 2**30
    assert _json(capsys, "--params", "1B", "--gpu-memory", "80G")["gpu_memory_bytes"] == 80 * 2**30
    assert _json(capsys, "--params", "1B", "--gpu-memory", "80GB")["gpu_memory_bytes"] == 80 * 2**30  # the label's GB


@pytest.mark.parametrize("extra", [[], ["--fp32-grad-accum"], ["--offload-optimizer", "nvme", "--offload-param", "nvme"]])
def test_the_table_keeps_stage_and_fits_at_80_columns(extra: list[str]) -> None:
    from rich.console import Console

    from zerorun.estimate import Offload
    from zerorun.estimate.render import estimate_table

    training = Training(7 * 10**9, 8, fp32_grad_accum="--fp32-grad-accum" in extra)
    shape = ModelShape(hidden=4096, layers=32, heads=32, vocab=32000)
    request = EstimateRequest(training, gpus_per_node=8, shape=shape, gpu_memory=80 * GiB)
    pinned = (Offload.NVME, Offload.NVME) if "nvme" in extra else (None, None)
    console = Console(width=80, record=True)
    console.print(estimate_table(estimate(request, *pinned)))
    lines = console.export_text().splitlines()
    header = next(line for line in lines if "offload" in line)
    assert "stage" in header.split() and "fits" in header.split() and "total" in header.split()
    rows = [line for line in lines if line.split() and line.split()[-1] in ("yes", "no")]
    assert rows and all(len(line) <= 80 and "…" not in line for line in rows)


@pytest.mark.timeout(120)
def test_measure_runs_the_script_and_compares_term_by_term(capsys: pytest.CaptureFixture[str]) -> None:
    # 2 gloo ranks, the toy at hidden 16: the estimate for the config the engine ran vs its memory_breakdown
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = f"{root / 'examples' / 'train_toy.py'} --config {root / 'templates' / 'zero2.yaml'} --hidden 16 --layers 2"
    code = main(["estimate", "--gpus", "2", "--measure", script, "--measure-steps", "1", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(out)
    assert data["measured"]["stage"] == 2 and data["measured"]["world_size"] == 2
    terms = {t["term"]: t for t in data["terms"]}
    # transport: the same-host lane of the two gloo ranks (absent where the lane cannot open)
    # host_runtime, allocator_retention: what a CPU rank holds beside the engine (physical figures are the host's)
    assert set(terms) - {"transport"} == {"params", "gradients", "master_params", "optimizer_states", "buffers",
                                          "in_flight", "host_runtime", "allocator_retention", "total"}
    for name, term in terms.items():  # the bookkeeping: padding of the flat buckets and Adam's step counters only
        if name in ("in_flight", "transport", "host_runtime", "allocator_retention", "total"):
            continue  # the engine keeps no count of what a step holds in flight
        assert term["measured_bytes"] > 0 and abs(term["ratio"] - 1) < 0.01, (name, term)
    assert terms["in_flight"]["estimated_bytes"] > 0
    assert terms["total"]["estimated_bytes"] == sum(t["estimated_bytes"] for n, t in terms.items() if n != "total")
    physical = data["physical"]  # the figure that counts: the worse rank's physical peak
    assert physical["kind"] == "host_peak_rss - host_baseline_rss" and len(physical["per_rank_bytes"]) == 2
    assert physical["peak_bytes"] == max(physical["per_rank_bytes"])
    assert physical["per_rank_bytes"][physical["worst_rank"]] == physical["peak_bytes"]
    assert physical["estimated_bytes"] == terms["total"]["estimated_bytes"]
    # whatever else the process holds, its resident set holds the model states the engine counts
    assert physical["peak_bytes"] >= terms["total"]["measured_bytes"] > 0


def test_stage3_per_link_under_hpz_in_the_json_and_the_text(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--params", "70B", "--gpus-per-node", "8", "--nodes", "64", "--gpu-memory", "80GB", "--hpz", "8"]
    links = _json(capsys, *args)["stage3_links"]
    assert (links["world_size"], links["gpus_per_node"], links["policy"]) == (512, 8, "hpZ 8")
    assert links["later_steps"]["backward_all_gather"]["across"] == 0
    assert links["secondary_bytes"] == 2 * 70 * 10**9 // 8  # no shape: 2 Psi / hpz
    assert main(["estimate", *args]) == 0
    text = capsys.readouterr().out
    assert "stage 3 per link and step: hpZ 8, 64 node(s) of 8" in text
    assert "hpZ secondary copy per rank: 16.30 GiB" in text
    assert main(["estimate", "--params", "7B", "--gpus", "8", "--nodes", "2", "--mics", "5"]) == 1
    assert "mics_shard_size 5 does not tile a world of 16" in capsys.readouterr().err


def test_every_buffer_is_a_row_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    """The table's ``buf`` column, buffer by buffer: in the JSON and as lines below the table, summing to it."""
    args = ["--params", "124M", "--gpus", "2", "--dtype", "fp32", "--hidden", "768", "--layers", "12", "--heads", "12",
            "--offload-optimizer", "none", "--offload-param", "none"]
    data = _json(capsys, *args)
    stage3 = next(r for r in data["rows"] if r["stage"] == 3)
    assert set(stage3["buffer_bytes"]) >= {"reduce_staging", "gathered_params", "unit_gradients"}
    for row in data["rows"]:
        assert sum(row["buffer_bytes"].values()) == row["per_gpu_bytes"]["buffers"], row
    assert main(["estimate", *args]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("buffers, stage 3"))
    assert "gradient staging" in line and "gathered window" in line and "gradient in hand" in line
    assert not any(ln.startswith("buffers, stage 0") for ln in out.splitlines())  # stage 0 stages nothing
