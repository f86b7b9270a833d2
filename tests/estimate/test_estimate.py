"""The memory model's arithmetic: model states per stage, offload, buffers, activations, counts."""

from __future__ import annotations

import json

import pytest

from zerorun.estimate import (
    FIT_HEADROOM,
    ActivationPolicy,
    Buckets,
    CountError,
    Dtype,
    EstimateRequest,
    GiB,
    Layout,
    ModelShape,
    Offload,
    Optimizer,
    Placement,
    PlacementError,
    ShapeError,
    Training,
    activation_bytes,
    buffer_terms,
    engine_breakdown,
    estimate,
    layer_activation_bytes,
    model_states,
    parse_bytes,
    parse_param_count,
    placements,
    recommend,
    shape_from_hf_config,
)

NO_OFFLOAD = [Placement(s) for s in range(4)]


def _totals(params: int, n: int, **kw: object) -> list[int]:
    training = Training(params, n, **kw)  # type: ignore[arg-type]
    return [model_states(training, p).total for p in NO_OFFLOAD]


def test_14b_on_8_gpus_matches_the_zero_paper() -> None:
    paper = [224 * 10**9, 77 * 10**9, 52_500_000_000, 28 * 10**9]
    assert _totals(14_000_000_000, 8, layout=Layout.PAPER) == paper


def test_7b_on_2_gpus_matches_the_zero_paper() -> None:
    assert _totals(7_000_000_000, 2, layout=Layout.PAPER) == [112 * 10**9, 70 * 10**9, 63 * 10**9, 56 * 10**9]


def test_default_layout_is_the_engines_fp32_gradient_shard() -> None:
    # stages 2-3 hold the gradient shard in fp32: 2 more bytes per parameter per rank than the paper
    psi, n = 14_000_000_000, 8
    engine, paper = _totals(psi, n), _totals(psi, n, layout=Layout.PAPER)
    assert engine[:2] == paper[:2]
    assert [e - p for e, p in zip(engine[2:], paper[2:], strict=True)] == [2 * psi // n, 2 * psi // n]
    assert engine[2] == 2 * psi + 16 * psi // n and engine[3] == 18 * psi // n
    for stage in range(4):  # the rows and engine_breakdown are one arithmetic
        breakdown = engine_breakdown(stage, Dtype.BF16, Optimizer.ADAM, n, psi)
        assert sum(breakdown.values()) == engine[stage]


def test_world_size_counts_every_node() -> None:
    # 2 nodes x 4 GPUs is N = 8, the same as 1 x 8
    est = estimate(EstimateRequest(Training(14_000_000_000, 8), gpus_per_node=4, nodes=2))
    assert [r.model_states for r in est.rows if r.placement in NO_OFFLOAD] == _totals(14_000_000_000, 8)


def test_fp32_training_has_no_master_and_k_8() -> None:
    psi = 1_000_000
    states = model_states(Training(psi, 1, Dtype.FP32), Placement(0))
    assert (states.params, states.gradients, states.master_params, states.optimizer_states) == (
        4 * psi, 4 * psi, 0, 8 * psi,
    )


@pytest.mark.parametrize(
    ("optimizer", "dtype", "per_param"),
    [
        (Optimizer.ADAMW, Dtype.BF16, 16),
        (Optimizer.SGD, Dtype.FP16, 12),  # 2 + 2 + master 4 + momentum 4
        (Optimizer.SGD_NO_MOMENTUM, Dtype.BF16, 8),
        (Optimizer.SGD, Dtype.FP32, 12),  # 4 + 4 + momentum 4
        (Optimizer.SGD_NO_MOMENTUM, Dtype.FP32, 8),
    ],
)
def test_optimizer_state_sizes(optimizer: Optimizer, dtype: Dtype, per_param: int) -> None:
    assert _totals(1000, 1, dtype=dtype, optimizer=optimizer)[0] == per_param * 1000


def test_fp32_gradient_copy_gives_deepspeeds_18_bytes() -> None:
    psi, n = 14_000_000_000, 8
    training = Training(psi, n, fp32_grad_accum=True)
    stage2 = model_states(training, Placement(2))
    assert stage2.grad_accum == 4 * psi // n
    assert stage2.total == 2 * psi + 18 * psi // n  # DeepSpeed's estimate_zero2: 59.5 GB
    assert model_states(training, Placement(0)).grad_accum == 4 * psi
    assert model_states(Training(psi, n, Dtype.FP32, fp32_grad_accum=True), Placement(2)).grad_accum == 0


def test_shards_are_padded_like_the_engine() -> None:
    states = model_states(Training(10, 4), Placement(3))
    assert states.params == 3 * 2  # ceil(10 / 4) elements of 2 bytes
    assert engine_breakdown(3, "bf16", "adam", 4, 10, fp32_gradient_shard=False) == {
        "params": 6, "gradients": 6, "master_params": 12, "optimizer_states": 24, "buffers": 0,
    }


def test_engine_breakdown_stage_by_stage() -> None:
    psi, n = 1000, 2
    got = [engine_breakdown(s, Dtype.FP16, Optimizer.ADAM, n, psi) for s in range(4)]
    assert [g["params"] for g in got] == [2000, 2000, 2000, 1000]
    assert [g["gradients"] for g in got] == [2000, 2000, 2000, 2000]  # the engine's fp32 gradient shard
    paper = [engine_breakdown(s, Dtype.FP16, Optimizer.ADAM, n, psi, fp32_gradient_shard=False) for s in range(4)]
    assert [g["gradients"] for g in paper] == [2000, 2000, 1000, 1000]
    assert [g["master_params"] for g in got] == [4000, 2000, 2000, 2000]
    assert [g["optimizer_states"] for g in got] == [8000, 4000, 4000, 4000]


def test_offload_optimizer_keeps_only_the_16bit_parameters_on_the_device() -> None:
    """Invariant 8: with optimizer offload no gradient shard and no master stay on the device; the reduced
    gradient is the rank's shard in the host accumulator (DeepSpeed's layout: its fp32 partition)."""
    psi, n = 14_000_000_000, 8
    for training in (Training(psi, n, fp32_grad_accum=True), Training(psi, n)):
        for stage in (1, 2, 3):
            on_gpu = model_states(training, Placement(stage))
            off = model_states(training, Placement(stage, Offload.CPU))
            assert off.gpu["params"] == on_gpu.gpu["params"]
            assert off.gpu["gradients"] == 0
            assert off.gpu["optimizer_states"] == 0 and off.gpu["grad_accum"] == 0
            assert off.cpu == 12 * psi // n + 4 * psi // n and off.nvme == 0
            assert off.total == off.params + off.cpu
    nvme = model_states(Training(psi, n, fp32_grad_accum=True), Placement(3, Offload.NVME))
    assert nvme.cpu == 0 and nvme.nvme == 16 * psi // n  # DeepSpeed's layout: its fp32 partition is swapped
    nvme = model_states(Training(psi, n), Placement(3, Offload.NVME))
    assert nvme.cpu == 4 * psi // n and nvme.nvme == 16 * psi // n  # the host accumulator, swapped at the step


def test_offload_param_moves_the_parameter_shard() -> None:
    psi, n = 14_000_000_000, 8
    both = model_states(Training(psi, n), Placement(3, Offload.CPU, Offload.CPU))
    assert both.gpu == {"params": 0, "gradients": 0, "optimizer_states": 0, "grad_accum": 0}
    assert both.cpu == 18 * psi // n
    split = model_states(Training(psi, n), Placement(3, Offload.CPU, Offload.NVME))
    assert (split.cpu, split.nvme) == (16 * psi // n, 2 * psi // n)


def test_cpu_figures_are_per_node() -> None:
    psi = 14_000_000_000
    est = estimate(EstimateRequest(Training(psi, 8), gpus_per_node=4, nodes=2), Offload.CPU)
    stage2 = next(r for r in est.rows if r.placement.stage == 2)
    assert stage2.cpu_per_node == 4 * (16 * psi // 8)  # master, moments and the host's fp32 gradient shard


def test_invalid_placements_are_errors_with_hints() -> None:
    with pytest.raises(PlacementError, match="stage 3") as err:
        Placement(2, Offload.NONE, Offload.CPU)
    assert err.value.hint
    with pytest.raises(PlacementError, match="stage 0"):
        Placement(0, Offload.CPU)
    with pytest.raises(PlacementError):
        Placement(4)


def test_default_rows_and_pinned_offload_rows() -> None:
    default = [(p.stage, p.offload_optimizer.value, p.offload_param.value) for p in placements()]
    assert default == [
        (0, "none", "none"), (1, "none", "none"), (1, "cpu", "none"), (2, "none", "none"),
        (2, "cpu", "none"), (3, "none", "none"), (3, "cpu", "none"), (3, "cpu", "cpu"),
    ]
    assert [p.stage for p in placements(Offload.NVME)] == [1, 2, 3]
    assert [p.stage for p in placements(None, Offload.CPU)] == [3]
    assert [p.stage for p in placements(Offload.NONE, Offload.NONE)] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("14B", 14 * 10**9), ("7.5b", 7_500_000_000), ("350M", 350_000_000), ("1.3e9", 1_300_000_000),
     ("125000000", 125_000_000), ("20k", 20_000), (" 1T ", 10**12), (42, 42)],
)
def test_parse_param_count(text: str, expected: int) -> None:
    assert parse_param_count(text) == expected


@pytest.mark.parametrize("text", ["", "14 billion", "B", "-3B", "1.2.3B", "14X", "0", "nan"])
def test_parse_param_count_rejects(text: str) -> None:
    with pytest.raises(CountError) as err:
        parse_param_count(text)
    assert err.value.hint


def test_parse_bytes_units() -> None:
    assert parse_bytes("80GB") == 80 * 10**9
    assert parse_bytes("80GiB") == 80 * GiB
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("1024") == 1024
    with pytest.raises(CountError):
        parse_bytes("80 parsecs")


def test_buffers_follow_the_stage_and_never_exceed_the_model() -> None:
    training = Training(10**9, 8)
    buckets = Buckets(reduce_bucket_size=2 * 10**8, allgather_bucket_size=3 * 10**8, overlap_comm=True)
    # stages 0-1 reduce and gather in place: the gradient buffers are the communication buffers
    assert buffer_terms(training, Placement(0), buckets, None) == {}
    assert buffer_terms(training, Placement(1), buckets, None) == {}
    # on NCCL the configured reduce_bucket_size is the layout; on gloo stages 0-2 cap it at 2^21 elements
    assert buffer_terms(training, Placement(2), buckets, None) == {"reduce_staging": 2 * 10**8 * 2 * 2}
    gloo = Buckets(reduce_bucket_size=2 * 10**8, overlap_comm=True, layout_cap=2**21)
    assert buffer_terms(training, Placement(2), gloo, None) == {"reduce_staging": 2**21 * 2 * 2}
    no_overlap = Buckets(reduce_bucket_size=10**6, overlap_comm=False)
    assert buffer_terms(training, Placement(2), no_overlap, None) == {"reduce_staging": 10**6 * 2}
    tiny = Training(1000, 2)
    assert buffer_terms(tiny, Placement(2), Buckets(), None) == {"reduce_staging": 2000}
    # a parameter larger than the bucket gets a bucket of its own
    shape = ModelShape(hidden=1024, layers=2, heads=8, vocab=50000)
    big = Training(shape.param_count(), 2)
    assert buffer_terms(big, Placement(2), Buckets(reduce_bucket_size=1000, overlap_comm=False), shape) == {
        "reduce_staging": 50000 * 1024 * 2,
    }


def test_stage3_buffers_gather_what_the_coordinator_keeps() -> None:
    shape = ModelShape(hidden=1024, layers=4, heads=16, vocab=32000)  # tied head
    training = Training(shape.param_count(), 4)
    buckets = Buckets(reduce_bucket_size=10**6, stage3_prefetch_bucket_size=10**6, stage3_max_live_parameters=10**9)
    terms = buffer_terms(training, Placement(3), buckets, shape)
    unit = shape.largest_unit()
    assert terms["reduce_staging"] == 32000 * 1024 * 2 * 2  # the embedding's own bucket, overlapped at stage 3
    assert unit == 32000 * 1024  # the embedding beats a 12.6M-parameter block
    # the default reuse distance (1e9) exceeds the model: forward keeps every non-persistent unit for backward
    assert terms["gathered_params"] == (shape.param_count() - 9 * 1024) * 2
    assert terms["unit_gradients"] == unit * 2
    assert terms["persistent_params"] == 9 * 1024 * 2  # 2 norms per layer + the final norm
    # nothing kept: the tied embedding (held by the root through the pass) + the largest layer unit (4h x h);
    # no other unit fits the 1e6-element prefetch
    mlp = 4 * 1024 * 1024
    no_reuse = Buckets(reduce_bucket_size=10**6, stage3_prefetch_bucket_size=10**6, stage3_max_reuse_distance=0)
    assert buffer_terms(training, Placement(3), no_reuse, shape)["gathered_params"] == (unit + mlp) * 2
    capped = buffer_terms(training, Placement(3), Buckets(stage3_max_live_parameters=10), shape)
    assert capped["gathered_params"] == (unit + mlp) * 2  # the cap keeps nothing; what runs is gathered regardless


def test_korthikanti_activations_match_the_published_per_layer_figures() -> None:
    # h=5120, a=40, s=4096, b=1: 3.79 GiB per layer, 181.9 GiB for 48 layers; 34sbh alone 31.9 GiB
    shape = ModelShape(hidden=5120, layers=48, heads=40, seq_len=4096, micro_batch=1)
    plain = activation_bytes(shape, Dtype.BF16, ActivationPolicy())
    flash = activation_bytes(shape, Dtype.BF16, ActivationPolicy(flash_attention=True))
    assert plain / GiB == pytest.approx(181.9, abs=0.1)
    assert flash / GiB == pytest.approx(31.9, abs=0.1)
    layer = layer_activation_bytes(shape, Dtype.BF16, ActivationPolicy())
    ckpt = activation_bytes(shape, Dtype.BF16, ActivationPolicy(checkpointing=True))
    assert ckpt == 48 * 2 * 4096 * 5120 + layer  # layer inputs (1.88 GiB) + one layer recomputed
    assert activation_bytes(shape, Dtype.FP32, ActivationPolicy()) == 2 * plain


def test_logits_are_added_when_the_vocabulary_is_known() -> None:
    base = ModelShape(hidden=256, layers=2, heads=4, seq_len=128, micro_batch=2)
    with_vocab = ModelShape(hidden=256, layers=2, heads=4, seq_len=128, micro_batch=2, vocab=1000)
    policy = ActivationPolicy()
    assert activation_bytes(with_vocab, Dtype.BF16, policy) - activation_bytes(base, Dtype.BF16, policy) == 128 * 2 * 1000 * 4


def test_llama2_7b_config_gives_its_published_parameter_count(tmp_path) -> None:
    config = {
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000, "hidden_act": "silu",
        "tie_word_embeddings": False, "max_position_embeddings": 4096,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    shape = shape_from_hf_config(path, seq_len=1024, micro_batch=4)
    assert shape.param_count() == 6_738_415_616
    assert (shape.seq_len, shape.micro_batch, shape.gated_mlp) == (1024, 4, True)


def test_gpt2_style_keys_and_tied_embeddings(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257}))
    shape = shape_from_hf_config(path)
    assert shape.param_count() == 12 * (4 * 768**2 + 2 * 768 * 3072 + 2 * 768) + 50257 * 768 + 768


def test_bad_model_configs_name_the_file(tmp_path) -> None:
    with pytest.raises(ShapeError, match="no such file"):
        shape_from_hf_config(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"hidden_size": 4096,\n oops}')
    with pytest.raises(ShapeError, match=r"broken.json:2"):
        shape_from_hf_config(broken)
    partial = tmp_path / "partial.json"
    partial.write_text('{"hidden_size": 4096}')
    with pytest.raises(ShapeError, match="num_hidden_layers, num_attention_heads"):
        shape_from_hf_config(partial)


def test_recommendation_prefers_least_communication_that_fits() -> None:
    psi = 7_000_000_000
    request = EstimateRequest(Training(psi, 8), gpus_per_node=8, gpu_memory=200 * GiB)
    assert estimate(request).recommendation.row.placement == Placement(0)
    tight = EstimateRequest(Training(psi, 8), gpus_per_node=8, gpu_memory=32 * GiB)
    est = estimate(tight)
    chosen = est.recommendation.row
    assert chosen is not None and chosen.fits
    assert chosen.placement == Placement(2)  # stage 2 needs ~27 GiB, stage 1 ~39 GiB
    assert not any(r.fits for r in est.rows if r.placement in (Placement(0), Placement(1)))
    assert "stage 2" in est.recommendation.reason


def test_one_fit_threshold_for_fits_and_the_recommendation() -> None:
    request = EstimateRequest(Training(7_000_000_000, 8), gpus_per_node=8, overhead=0)
    rows = estimate(request).rows
    stage1 = next(r for r in rows if r.placement == Placement(1))
    exact = recommend(rows, stage1.total)  # stage 1 would fill the GPU to the byte: not a fit
    assert exact.row is not None and exact.row.placement != Placement(1)
    roomy = int(stage1.total / (1 - FIT_HEADROOM)) + 1
    chosen = estimate(EstimateRequest(Training(7_000_000_000, 8), gpus_per_node=8, overhead=0, gpu_memory=roomy))
    assert chosen.recommendation.row is not None and chosen.recommendation.row.placement == Placement(1)
    for row in chosen.rows:  # `fits` and the recommendation agree row by row
        assert row.fits == (row.total <= roomy * (1 - FIT_HEADROOM))
    assert f"{FIT_HEADROOM:.0%}" in chosen.recommendation.reason


def test_no_recommendation_without_memory_or_when_nothing_fits() -> None:
    unknown = estimate(EstimateRequest(Training(10**9, 1), gpus_per_node=1))
    assert unknown.recommendation.row is None and "--gpu-memory" in unknown.recommendation.reason
    assert all(r.fits is None for r in unknown.rows)
    nothing = estimate(EstimateRequest(Training(10**12, 1), gpus_per_node=1, gpu_memory=GiB))
    assert nothing.recommendation.row is None and "nothing fits" in nothing.recommendation.reason


def test_row_total_is_the_sum_of_its_terms() -> None:
    shape = ModelShape(hidden=2048, layers=24, heads=16, vocab=50000)
    request = EstimateRequest(Training(shape.param_count(), 4), gpus_per_node=4, shape=shape, overhead=123)
    for row in estimate(request).rows:
        data = row.to_json()["per_gpu_bytes"]
        assert data["total"] == sum(v for k, v in data.items() if k != "total")
        assert data["overhead"] == 123 and data["activations"] > 0
