"""The memory model behind ``zerorun estimate``: pure functions, no torch import.

    from zerorun.estimate import EstimateRequest, Training, estimate
    est = estimate(EstimateRequest(Training(params=14_000_000_000, world_size=8), gpus_per_node=8))
    [row.model_states for row in est.rows]        # bytes per GPU, term by term in row.gpu
"""

from __future__ import annotations

from zerorun.estimate.activations import ActivationPolicy, activation_bytes, layer_activation_bytes
from zerorun.estimate.buffers import Buckets, buffer_terms
from zerorun.estimate.counts import GB, CountError, GiB, gib, parse_bytes, parse_gpu_memory, parse_param_count
from zerorun.estimate.floor import Floor, physical_floor
from zerorun.estimate.in_flight import InFlight, StepSizes, in_flight
from zerorun.estimate.memory_model import (
    DEFAULT_OVERHEAD,
    FIT_HEADROOM,
    Estimate,
    EstimateRequest,
    Recommendation,
    Row,
    estimate,
    estimate_row,
    placements,
    recommend,
    usable_bytes,
)
from zerorun.estimate.model_states import (
    PAPER_REFERENCE,
    Dtype,
    Layout,
    Masters,
    ModelStates,
    Offload,
    Optimizer,
    Placement,
    PlacementError,
    Training,
    engine_breakdown,
    model_states,
    paper_reference,
)
from zerorun.estimate.shape import ModelShape, ShapeError, shape_from_hf_config

__all__ = [
    "DEFAULT_OVERHEAD", "FIT_HEADROOM", "PAPER_REFERENCE", "Layout", "Masters", "paper_reference", "usable_bytes", "GB", "GiB", "ActivationPolicy", "Buckets", "CountError", "Dtype", "Estimate",
    "EstimateRequest", "ModelShape", "ModelStates", "Offload", "Optimizer", "Placement", "PlacementError",
    "Recommendation", "Row", "ShapeError", "Training", "activation_bytes", "buffer_terms", "engine_breakdown",
    "estimate", "estimate_row", "gib", "layer_activation_bytes", "model_states", "parse_bytes", "parse_gpu_memory",
    "parse_param_count", "placements", "recommend", "shape_from_hf_config", "Floor", "physical_floor", "InFlight",
    "StepSizes", "in_flight",
]
