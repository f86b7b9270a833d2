"""Find and read the files of a DeepSpeed ZeRO checkpoint tag, without DeepSpeed installed.

A tag directory written by DeepSpeed 0.19.8 holds (``mp_rank_00``: zerorun reads no
tensor-parallel checkpoints):

- stages 1-2: ``mp_rank_00_model_states.pt``; stage 3: ``zero_pp_rank_R_mp_rank_00_model_states.pt``
  for every data-parallel rank R (the module state dict, with the parameters as empty
  placeholders at stage 3, the parameter names and shapes per group, the counters, the
  scheduler and the client's keys);
- ``zero_pp_rank_R_mp_rank_00_optim_states.pt`` per rank R (``bf16_zero_pp_rank_...`` when
  bf16 was on): the rank's slice of the fp32 masters and the optimizer state.

The optimizer files pickle a few DeepSpeed classes (the loss scaler, the stage enum, the
slice addresses); they load as inert stand-ins (:data:`STAND_INS`), so no DeepSpeed import
is needed, and every file loads as data only (``safe_load``): any other global is refused.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import IO, Any

from zerorun.engine.checkpoint import safe_load
from zerorun.engine.checkpoint.errors import CheckpointError
from zerorun.engine.policy import policy_for_stage

MODEL_FILE = "mp_rank_00_model_states.pt"
_OPTIM = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_MODEL3 = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")


class DeepSpeedObject:
    """Stand-in for a pickled DeepSpeed object: keeps its constructor arguments and its state, runs nothing."""

    def __new__(cls, *args: Any, **kwargs: object) -> DeepSpeedObject:
        obj = super().__new__(cls)
        obj.args = args
        return obj

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        self.state = state

    def __int__(self) -> int:  # ZeroStageEnum(1) unpickles as DeepSpeedObject(1)
        return int(self.args[0])


def _stand_in(module: str, name: str) -> type[DeepSpeedObject]:
    """An inert class under DeepSpeed's own module and name, so torch's allowlist finds it by that name."""
    return type(name, (DeepSpeedObject,), {"__module__": module, "__qualname__": name})


# The classes DeepSpeed 0.19.8 pickles into its checkpoint files (the loss scalers, the stage enum, the slice
# addresses of param_slice_mappings): the only globals a DeepSpeed file may name beyond torch's tensors
STAND_INS: dict[str, type[DeepSpeedObject]] = {
    f"{m}.{n}": _stand_in(m, n) for m, n in (
        ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
        ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
        ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
        ("deepspeed.utils.tensor_fragment", "fragment_address"),
    )}


class _TrustingUnpickler(pickle.Unpickler):
    """For files the user vouched for (``trust``): DeepSpeed's classes as stand-ins, any other global as is."""

    def find_class(self, module: str, name: str) -> Any:  # any global: the user vouched for the file
        if module == "deepspeed" or module.startswith("deepspeed."):
            return STAND_INS.get(f"{module}.{name}") or _stand_in(module, name)
        return super().find_class(module, name)


class _TrustingPickleModule:
    """What ``torch.load(pickle_module=...)`` needs: an ``Unpickler`` and a ``load``."""

    Unpickler = _TrustingUnpickler

    @staticmethod
    def load(file: IO[bytes], **kwargs: Any) -> Any:  # whatever the file pickled
        return _TrustingUnpickler(file, **kwargs).load()


def load(file: Path, trust: bool = False) -> dict[str, Any]:
    """One DeepSpeed file as data (tensors, containers, the stand-ins); any global only with ``trust``."""
    try:
        return safe_load.load(file, trust, tuple(STAND_INS.values()), _TrustingPickleModule,
                              what="DeepSpeed checkpoint file")
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        raise CheckpointError(f"{file}: cannot read this DeepSpeed checkpoint file ({e})",
                              "the checkpoint is incomplete or damaged; load an earlier tag") from e


def is_deepspeed(tag_dir: Path) -> bool:
    """A DeepSpeed tag directory: it holds DeepSpeed's model-states or optimizer-states files."""
    return tag_dir.is_dir() and any(_OPTIM.match(f.name) or _MODEL3.match(f.name) or f.name == MODEL_FILE
                                    for f in tag_dir.iterdir())


def _ranked(tag_dir: Path, pattern: re.Pattern[str], what: str) -> list[Path]:
    """The files matching ``pattern`` in rank order; every rank 0..N-1 present, model parallel rank 00 only."""
    found: dict[int, Path] = {}
    for f in tag_dir.iterdir():
        m = pattern.match(f.name)
        if m is None:
            continue
        if int(m.groups()[-1]) != 0:
            raise CheckpointError(f"{f}: a tensor-parallel DeepSpeed checkpoint (model-parallel rank "
                                  f"{m.groups()[-1]})", "zerorun loads data-parallel ZeRO checkpoints "
                                  "(mp_rank_00 only); convert it with DeepSpeed's universal checkpoint first")
        found[int(m.groups()[-2])] = f
    missing = sorted(set(range(max(found) + 1)) - set(found)) if found else [0]
    if missing:
        raise CheckpointError(f"{tag_dir}: the DeepSpeed {what} file of rank(s) {missing} is missing "
                              f"(found {len(found)})", "copy the whole tag directory that every rank wrote, "
                              "or load an earlier tag")
    return [found[r] for r in range(len(found))]


def optim_files(tag_dir: Path) -> list[Path]:
    """``*_optim_states.pt`` of ranks 0..N-1, in rank order."""
    return _ranked(tag_dir, _OPTIM, "optimizer-states (*_optim_states.pt)")


def model_files(tag_dir: Path, stage: int) -> list[Path]:
    """The model-states files: one (``mp_rank_00_model_states.pt``) at stages 1-2, one per rank at stage 3."""
    if policy_for_stage(stage).shard_parameters:
        return _ranked(tag_dir, _MODEL3, "model-states (zero_pp_rank_R_mp_rank_00_model_states.pt)")
    file = tag_dir / MODEL_FILE
    if not file.is_file():
        raise CheckpointError(f"{tag_dir}: {MODEL_FILE} is missing from this stage-{stage} DeepSpeed checkpoint",
                              "copy the whole tag directory DeepSpeed wrote (rank 0 writes this file)")
    return [file]
