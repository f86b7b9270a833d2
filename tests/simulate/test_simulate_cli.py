"""`zerorun simulate` through the CLI: text within 80 columns, --json with the same figures, errors, HF configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerorun.cli import main
from zerorun.estimate.counts import human_bytes

SMALL = ["simulate", "--world", "64", "--rank", "63", "--params", "124M", "--family", "gpt2", "--meta", "--steps", "2",
         "--gpus-per-node", "8", "--hpz", "8"]


def test_text_fits_80_columns_and_json_carries_the_same_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SMALL) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "simulated rank 63 of 64 on the meta device" in text
    assert main([*SMALL, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["world_size"], data["rank"], data["device"], data["stage"]) == (64, 63, "meta", 3)
    assert data["params"] == 124_439_808  # GPT-2 small: the preset itself (tied head, learned positions)
    steps = data["communication"]["steps"]
    assert len(steps) == 2 and all(s["elements"] > 2 * data["params"] for s in steps)
    assert f"{steps[0]['psi']:.4f}" in text  # the text shows the same per-step figure
    memory = data["memory"]
    excess = sum(memory["simulated"][t] - memory["estimate"][t] for t in memory["estimate"])
    assert 0 <= excess <= memory["model_states_bound_bytes"]
    assert all(p["rss_peak"] is None for p in data["phases"].values())  # meta: no physical peak
    links = data["communication"]["by_link"]  # hpZ 8 on 8 nodes of 8: the same figures in the text
    simulated, estimate = links["simulated"]["steps"][-1], links["estimate"]["later_steps"]
    assert simulated["backward_all_gather"]["across"] == estimate["backward_all_gather"]["across"] == 0
    assert links["simulated"]["secondary_bytes"] > 0 and links["estimate"]["secondary_bytes"] > 0
    assert "per link, step 2: hpZ 8, 8 node(s) of 8" in text
    forward = next(line for line in text.splitlines() if line.strip().startswith("forward all gather"))
    # GPT-2's biases and positions are not the estimate's decoder units (Llama's are: test_simulate.py)
    shown = [human_bytes(simulated["forward_all_gather"]["across"]),
             human_bytes(estimate["forward_all_gather"]["across"])]
    assert all(figure in forward for figure in shown), (forward, shown)


def test_a_hugging_face_config_is_built_with_from_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 344,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
        "max_position_embeddings": 256, "tie_word_embeddings": False, "hidden_act": "silu"}))
    assert main(["simulate", "--world", "8", "--model", str(config), "--meta", "--stage", "2", "--steps", "1",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    shape_psi = 2 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 344 + 2 * 128) + 2 * 1000 * 128 + 128
    assert data["params"] == shape_psi
    assert data["communication"]["steps"][0]["psi"] == pytest.approx(2.0, abs=1e-3)


@pytest.mark.parametrize(("args", "message"), [
    (["--world", "8"], "exactly one of --model"),
    (["--world", "8", "--params", "7B", "--model", "c.json"], "exactly one of --model"),
    (["--world", "8", "--rank", "8", "--params", "7B"], "rank 8 is not in a world of 8"),
    (["--world", "8", "--params", "7B", "--family", "bert"], "no built-in family"),
    (["--world", "16", "--params", "7B", "--hpz", "3"], "zero_hpz_partition_size 3 does not divide"),
    (["--world", "16", "--params", "7B", "--mics", "6"], "mics_shard_size 6 does not tile"),
    (["--world", "12", "--params", "7B"], "not a whole number of nodes of 8"),
    (["--world", "16", "--params", "7B", "--stage", "2", "--qwz"], "qwZ is a stage-3 policy"),
])
def test_bad_input_names_the_flag(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *args, "--meta"]) in (1, 2)
    err = capsys.readouterr().err
    assert message in err and "hint:" in err
