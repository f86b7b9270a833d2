"""Model states per GPU under ZeRO: parameters, gradients, fp32 master, optimizer state.

The arithmetic of Rajbhandari et al. (arXiv:1910.02054, Fig. 1) with mixed-precision
Adam: 2Ψ compute-dtype parameters + 2Ψ gradients + KΨ optimizer states (K = 12:
fp32 master 4, m 4, v 4), per GPU

    stage 0: 16Ψ    stage 1: 4Ψ + 12Ψ/N    stage 2: 2Ψ + 14Ψ/N    stage 3: 16Ψ/N

where N is the total number of GPUs. That is ``Layout.PAPER``, kept as a reference.
The default, ``Layout.ENGINE``, is what the bundled engine holds: at stages 2 and 3
it keeps the rank's gradient shard in fp32 (4 bytes per element, not 2), so stage 2
is 2Ψ + 16Ψ/N and stage 3 18Ψ/N. A shard is ceil(Ψ/N) elements: the engine pads its
flat buffers to a multiple of N, so this is what a rank really holds.

With bf16 masters (``Masters.BF16``: ``bf16.bf16_master_weights_and_grads`` +
``bf16_optimizer_states``) the master is the bf16 parameter buffer itself (a separate bf16
copy only where the optimizer is offloaded), the gradient shard is bf16 and Adam's moments
are 2 + 2 bytes: stage 1 4Ψ + 4Ψ/N, stage 2 2Ψ + 6Ψ/N, stage 3 8Ψ/N with Adam. DeepSpeed
0.19.8 holds the same at stage 3 (its master is the bf16 partition there too) and a separate
bf16 master at stages 1-2 (2Ψ/N more).
``Masters.BF16_KAHAN`` adds the 2-byte compensation buffer of ``bf16.master_compensation:
kahan``; ``Masters.BF16_STOCHASTIC`` (stochastic rounding) costs no resting bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from zerorun.errors import ZerorunError


class Dtype(str, Enum):
    """The compute dtype of parameters and gradients."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def nbytes(self) -> int:
        return 4 if self is Dtype.FP32 else 2

    @property
    def mixed(self) -> bool:
        """16-bit compute with an fp32 master copy held by the optimizer."""
        return self is not Dtype.FP32


class Optimizer(str, Enum):
    """The optimizer, as far as its state size goes."""

    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"  # with momentum
    SGD_NO_MOMENTUM = "sgd-nomomentum"

    @property
    def state_bytes(self) -> int:
        """fp32 bytes of state per parameter, besides any master copy (Adam: m and v)."""
        return {"adam": 8, "adamw": 8, "sgd": 4, "sgd-nomomentum": 0}[self.value]


class Masters(str, Enum):
    """The dtype of the master weights, their reduced gradients and the optimizer's moments."""

    FP32 = "fp32"
    BF16 = "bf16"  # bf16.bf16_master_weights_and_grads + bf16_optimizer_states
    BF16_KAHAN = "bf16-kahan"  # ... + bf16.master_compensation: kahan (a bf16 compensation buffer)
    BF16_STOCHASTIC = "bf16-stochastic"  # ... + bf16.master_compensation: stochastic_rounding (no buffer)

    @property
    def low(self) -> bool:
        return self is not Masters.FP32

    @property
    def compensation_bytes(self) -> int:
        return 2 if self is Masters.BF16_KAHAN else 0


class Offload(str, Enum):
    """Where offloaded states live."""

    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


class PlacementError(ZerorunError):
    """A stage/offload combination that the engine does not run."""


class Layout(str, Enum):
    """Whose memory layout the arithmetic describes."""

    ENGINE = "engine"
    """The bundled engine: an fp32 gradient shard at stages 2-3 (its ``memory_breakdown``)."""
    PAPER = "paper"
    """The ZeRO paper's Fig. 1: 16-bit gradients everywhere (a reference, not a prediction)."""


@dataclass(frozen=True)
class Training:
    """What is trained: Ψ parameters on ``world_size`` GPUs in total."""

    params: int
    world_size: int
    dtype: Dtype = Dtype.BF16
    optimizer: Optimizer = Optimizer.ADAM
    fp32_grad_accum: bool = False  # DeepSpeed's own layout: 16-bit gradients plus an fp32 copy (its "18 B/param")
    layout: Layout = Layout.ENGINE
    masters: Masters = Masters.FP32

    def __post_init__(self) -> None:
        if self.masters.low and self.dtype is not Dtype.BF16:
            raise PlacementError(f"bf16 masters need bf16 compute, not {self.dtype.value}",
                                 hint="use --dtype bf16 with --masters bf16, or --masters fp32")

    @property
    def fp32_gradient_shard(self) -> bool:
        """The engine's layout: the sharded gradient (stages 2-3) is held in fp32."""
        return self.layout is Layout.ENGINE and not self.fp32_grad_accum

    def shard(self, stage_shards: bool) -> int:
        """Elements of one per-rank shard when sharded, else all Ψ."""
        return -(-self.params // self.world_size) if stage_shards else self.params


@dataclass(frozen=True)
class Placement:
    """A ZeRO stage and where the optimizer and (stage 3) parameter shards live."""

    stage: int
    offload_optimizer: Offload = Offload.NONE
    offload_param: Offload = Offload.NONE
    # Twin-Flow (``offload_optimizer.ratio``, stage 3): the fraction of the optimizer's terms offloaded; the
    # rest stays on the GPU and steps there
    offload_ratio: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.offload_ratio <= 1.0:
            raise PlacementError(f"offload ratio {self.offload_ratio:g} is not between 0 and 1",
                                 hint="give --offload-ratio as a fraction, e.g. 0.5")
        if self.offload_ratio < 1.0 and (self.stage != 3 or self.offload_optimizer is Offload.NONE):
            raise PlacementError(f"partial offload (ratio {self.offload_ratio:g}) needs stage 3 with "
                                 "optimizer offload", hint="use stage 3 with --offload-optimizer cpu or nvme")
        if self.stage not in (0, 1, 2, 3):
            raise PlacementError(f"ZeRO stage {self.stage} does not exist", hint="use a stage from 0 to 3")
        if self.stage == 0 and self.offload_optimizer is not Offload.NONE:
            raise PlacementError(
                "stage 0 does not offload the optimizer: its states are not sharded",
                hint="use stage 1 or higher with --offload-optimizer",
            )
        if self.stage < 3 and self.offload_param is not Offload.NONE:
            raise PlacementError(
                f"parameter offload needs stage 3, not stage {self.stage}",
                hint="drop --offload-param or use stage 3",
            )

    @property
    def stages_gradients(self) -> bool:
        """Gradients leave backward through reduce buckets of their own: at stages 2-3, and at every stage
        with optimizer offload (each reduced partition streams to the host accumulator as it lands)."""
        return self.stage >= 2 or self.offload_optimizer is not Offload.NONE

    @property
    def offload_label(self) -> str:
        """``-``, ``opt:cpu`` or ``opt:cpu par:nvme``: the compact form the tables print."""
        parts = []
        if self.offload_optimizer is not Offload.NONE:
            ratio = f"@{self.offload_ratio:g}" if self.offload_ratio < 1.0 else ""
            parts.append(f"opt:{self.offload_optimizer.value}{ratio}")
        if self.offload_param is not Offload.NONE:
            parts.append(f"par:{self.offload_param.value}")
        return " ".join(parts) or "-"

    @property
    def label(self) -> str:
        """``stage 3`` or ``stage 3, offload opt:cpu par:cpu``."""
        offload = self.offload_label
        return f"stage {self.stage}" + ("" if offload == "-" else f", offload {offload}")


@dataclass(frozen=True)
class ModelStates:
    """Bytes of model state one rank holds, split by term, and where they live."""

    params: int
    gradients: int
    master_params: int
    optimizer_states: int
    grad_accum: int
    gpu: dict[str, int]  # the terms resident on the GPU (offloaded terms are 0 here)
    cpu: int  # bytes this rank keeps in host memory
    nvme: int  # bytes this rank keeps on the NVMe path

    @property
    def total(self) -> int:
        """All model-state bytes, wherever they live."""
        return self.params + self.gradients + self.master_params + self.optimizer_states + self.grad_accum


def model_states(training: Training, placement: Placement) -> ModelStates:
    """Per-rank model-state bytes for one stage and offload choice (pure arithmetic)."""
    if training.masters.low:
        return _low_precision_states(training, placement)
    stage = placement.stage
    dtype = training.dtype
    params = training.shard(stage >= 3) * dtype.nbytes
    grad_elem = 4 if training.fp32_gradient_shard and stage >= 2 else dtype.nbytes
    gradients = training.shard(stage >= 2) * grad_elem
    opt_elems = training.shard(stage >= 1)
    master = opt_elems * 4 if dtype.mixed else 0
    states = opt_elems * training.optimizer.state_bytes
    # DeepSpeed keeps the fp32 gradient only for the rank's partition at stages 1-3.
    grad_accum = opt_elems * 4 if training.fp32_grad_accum and dtype.mixed else 0
    # offloaded, the reduced gradient is the rank's shard in the host's fp32 accumulator (DeepSpeed's layout:
    # that accumulator is its fp32 partition, ``grad_accum``)
    host_grads = 0 if grad_accum else opt_elems * 4
    return _placed(params, gradients, master, states, grad_accum, placement, host_grads)


def _low_precision_states(training: Training, placement: Placement) -> ModelStates:
    """bf16 masters, gradients and moments (the engine's layout, see the module docstring)."""
    stage = placement.stage
    if stage == 0:
        raise PlacementError("bf16 masters need ZeRO stage 1, 2 or 3 (as in DeepSpeed)",
                             hint="use stage 1-3, or --masters fp32")
    params = training.shard(stage >= 3) * 2
    gradients = training.shard(stage >= 2) * 2
    opt_elems = training.shard(True)
    # over bf16 parameters the master is the buffer itself; offloaded, a bf16 copy on the host
    master = opt_elems * 2 if placement.offload_optimizer is not Offload.NONE else 0
    states = opt_elems * (training.optimizer.state_bytes // 2 + training.masters.compensation_bytes)
    return _placed(params, gradients, master, states, 0, placement, opt_elems * 2)


def _placed(params: int, gradients: int, master: int, states: int, grad_accum: int,
            placement: Placement, host_grads: int) -> ModelStates:
    """The terms split by where they live: the GPU, or the offload devices.

    With optimizer offload the device holds no gradient shard and no master (invariant 8 of the
    design): each reduced partition goes to the host accumulator (``host_grads`` bytes, the
    masters' dtype) as its reduction lands; the reduce buckets in flight are buffers
    (:mod:`zerorun.estimate.buffers`). Twin-Flow (``ratio`` < 1) keeps its device share of
    master, state and gradient shard on the device and steps it there.
    """
    gpu = {"params": params, "gradients": gradients, "optimizer_states": master + states, "grad_accum": grad_accum}
    moved = {Offload.CPU: 0, Offload.NVME: 0}
    if placement.offload_optimizer is not Offload.NONE:
        r = placement.offload_ratio
        gradients = host_grads
        kept_states, kept_accum = round((master + states) * (1 - r)), round(grad_accum * (1 - r))
        kept_grads = round(gradients * (1 - r))
        moved[placement.offload_optimizer] += master + states + grad_accum - kept_states - kept_accum
        # the accumulator is host memory with either device (pinned, written as reductions land); NVMe also
        # keeps the gradients in swap files from the boundary to the step, as DeepSpeed does
        moved[Offload.CPU] += gradients - kept_grads
        if placement.offload_optimizer is Offload.NVME:
            moved[Offload.NVME] += gradients - kept_grads
        gpu["optimizer_states"] = kept_states
        gpu["grad_accum"] = kept_accum
        gpu["gradients"] = kept_grads
    if placement.offload_param is not Offload.NONE:
        moved[placement.offload_param] += params
        gpu["params"] = 0
    return ModelStates(
        params=params,
        gradients=gradients,
        master_params=master,
        optimizer_states=states,
        grad_accum=grad_accum,
        gpu=gpu,
        cpu=moved[Offload.CPU],
        nvme=moved[Offload.NVME],
    )


def engine_breakdown(
    stage: int,
    dtype: Dtype | str,
    optimizer: Optimizer | str,
    world_size: int,
    params: int,
    *,
    buffers: int = 0,
    fp32_gradient_shard: bool = True,
) -> dict[str, int]:
    """The estimate in the five keys of ``engine.memory_breakdown()``, for a direct comparison.

    zerorun's engine accumulates the sharded gradient (stages 2 and 3) in fp32, as
    DeepSpeed does: 4 bytes per shard element where the paper counts 2 (so its stage 2
    holds 2Ψ + 16Ψ/N with bf16 and Adam). ``fp32_gradient_shard=False`` gives the
    paper's layout. ``buffers`` is passed through: what counts as a buffer depends on
    the engine's bucket settings (``buffers.buffer_terms`` estimates those).
    """
    layout = Layout.ENGINE if fp32_gradient_shard else Layout.PAPER
    training = Training(params, world_size, Dtype(dtype), Optimizer(optimizer), layout=layout)
    states = model_states(training, Placement(stage))
    return {
        "params": states.params,
        "gradients": states.gradients,
        "master_params": states.master_params,
        "optimizer_states": states.optimizer_states,
        "buffers": buffers,
    }


PAPER_REFERENCE = "Rajbhandari et al. 2020 (arXiv:1910.02054), Fig. 1: model states only, 16-bit gradients"


def paper_reference(training: Training) -> dict[int, int]:
    """Per stage, the model-state bytes per GPU that the paper's arithmetic gives (no offload)."""
    paper = Training(training.params, training.world_size, training.dtype, training.optimizer, layout=Layout.PAPER)
    return {stage: model_states(paper, Placement(stage)).total for stage in range(4)}
