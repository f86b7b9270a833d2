"""ZeRO++'s buffers in the estimate: a row each when its key is on, nothing when it is off."""

from __future__ import annotations

from types import SimpleNamespace

from zerorun.engine.comm.quantize import packed_bytes
from zerorun.estimate.buffers import Buckets, buffer_terms, step_sizes, window_policy
from zerorun.estimate.model_states import Placement, Training
from zerorun.estimate.shape import ModelShape
from zerorun.estimate.stage3_window import decoder_window

SHAPE = ModelShape(hidden=1024, layers=4, heads=16, vocab=32000)
TRAINING = Training(SHAPE.param_count(), 8)
ZEROPP = ("hpz_secondary", "qwz_scratch", "qgz_scratch")


def test_no_zeropp_row_when_its_keys_are_off() -> None:
    for stage in range(4):
        assert not set(buffer_terms(TRAINING, Placement(stage), Buckets(), SHAPE)) & set(ZEROPP)
    # the keys on below stage 3 change nothing: ZeRO++ is a stage-3 mechanism
    on = Buckets(zero_hpz_partition_size=8, zero_quantized_weights=True, zero_quantized_gradients=True)
    assert buffer_terms(TRAINING, Placement(2), on, SHAPE) == buffer_terms(TRAINING, Placement(2), Buckets(), SHAPE)


def test_hpz_secondary_copy_is_the_sharded_parameters_over_the_node_group() -> None:
    buckets = Buckets(zero_hpz_partition_size=4)
    window = decoder_window(SHAPE, TRAINING.world_size, window_policy(buckets))
    sharded = window.total_numel - window.persistent_numel
    assert sharded < TRAINING.params  # the norms stay gathered: not in the secondary copy
    terms = buffer_terms(TRAINING, Placement(3), buckets, SHAPE)
    assert terms["hpz_secondary"] == -(-sharded // 4) * 2
    # without the shape every parameter counts
    assert buffer_terms(TRAINING, Placement(3), buckets, None)["hpz_secondary"] == -(-TRAINING.params // 4) * 2


def test_quantized_scratch_is_what_the_int8_collectives_allocate() -> None:
    buckets = Buckets(zero_quantized_weights=True, zero_quantized_gradients=True)
    sizes = step_sizes(TRAINING, Placement(3), buckets, SHAPE)
    terms = buffer_terms(TRAINING, Placement(3), buckets, SHAPE)
    world = TRAINING.world_size
    # the engine's own packing (zerorun.engine.comm.quantize), per rank's chunk, every rank's chunk received
    assert terms["qwz_scratch"] == world * packed_bytes(-(-sizes.gathered // world))
    chunk = -(-sizes.bucket // world)
    assert terms["qgz_scratch"] == 2 * world * packed_bytes(chunk) + 4 * chunk  # send, receive, the fp32 sum
    assert terms["qwz_scratch"] < terms["gathered_params"]  # int8: about a quarter of a bf16 window


def test_from_zero_config_reads_the_zeropp_keys() -> None:
    zero = SimpleNamespace(zero_hpz_partition_size=8, zero_quantized_weights=1, zero_quantized_gradients=False,
                           reduce_bucket_size=10**6)
    buckets = Buckets.from_zero_config(zero)
    assert (buckets.zero_hpz_partition_size, buckets.zero_quantized_weights, buckets.zero_quantized_gradients) == (
        8, True, False)
    assert buckets.reduce_bucket_size == 10**6 and buckets.stage3_prefetch_bucket_size == Buckets().stage3_prefetch_bucket_size
