"""The interface both accelerators share (:mod:`zerorun.compat.accelerator` picks one)."""

from __future__ import annotations

import functools
from typing import Any

import torch

from zerorun.errors import unsupported


def _typed_tensor(dtype: torch.dtype) -> property:
    """``accelerator.<Name>Tensor``: ``torch.tensor`` of ``dtype`` on the accelerator's device."""
    return property(lambda self: functools.partial(torch.tensor, dtype=dtype, device=self.device_name()))


class Accelerator:
    """What both accelerators share; subclasses fill in the device-specific part."""

    _name = "none"
    _communication_backend_name = "none"

    # ---- identity --------------------------------------------------------------------------
    def device_name(self, device_index: int | None = None) -> str:
        return self._name if device_index is None else f"{self._name}:{device_index}"

    def device(self, device_index: int | None = None) -> torch.device:
        return torch.device(self.device_name(device_index))

    def current_device_name(self) -> str:
        return self.device_name(self.current_device())

    def communication_backend_name(self) -> str:
        return self._communication_backend_name

    def is_synchronized_device(self) -> bool:
        return False

    def use_host_timers(self) -> bool:
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        return self.is_synchronized_device()

    def visible_devices_envs(self) -> list[str]:
        return []

    def set_visible_devices_envs(self, current_env: dict[str, str], local_accelerator_ids: list[int]) -> None:
        for name in self.visible_devices_envs():
            current_env[name] = ",".join(map(str, local_accelerator_ids))

    def export_envs(self) -> list[str]:
        return []

    def get_compile_backend(self) -> str:
        return "inductor"

    def is_compile_supported(self) -> bool:
        return hasattr(torch, "compile")

    def is_triton_supported(self) -> bool:
        return False

    # ---- random ----------------------------------------------------------------------------
    def random(self) -> Any:
        return torch.random

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def initial_seed(self) -> int:
        return torch.initial_seed()

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, new_state: torch.Tensor, device_index: int | None = None) -> None:
        torch.set_rng_state(new_state)

    def default_generator(self, device_index: int) -> torch.Generator:
        return torch.default_generator

    # ---- dtypes ----------------------------------------------------------------------------
    def supported_dtypes(self) -> list[torch.dtype]:
        out = [torch.float]
        if self.is_fp16_supported():
            out.append(torch.half)
        if self.is_bf16_supported():
            out.append(torch.bfloat16)
        return out

    # DeepSpeed's typed-tensor constructors (``get_accelerator().FloatTensor([1.0])``), on this device
    BFloat16Tensor = _typed_tensor(torch.bfloat16)
    HalfTensor = _typed_tensor(torch.half)
    FloatTensor = _typed_tensor(torch.float)
    LongTensor = _typed_tensor(torch.long)
    IntTensor = _typed_tensor(torch.int)
    ByteTensor = _typed_tensor(torch.uint8)

    # ---- tensors ---------------------------------------------------------------------------
    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name

    def range_push(self, msg: str) -> None:
        """Profiler range markers: nothing to mark without NVTX."""

    def range_pop(self) -> None:
        """Profiler range markers: nothing to mark without NVTX."""

    def lazy_call(self, callback: Any) -> Any:
        return callback()

    # ---- DeepSpeed's C++/CUDA op builders: not part of zerorun -----------------------------
    def create_op_builder(self, class_name: str) -> Any:
        unsupported(f"op builders (get_accelerator().create_op_builder({class_name!r}))")

    def get_op_builder(self, class_name: str) -> Any:
        unsupported(f"op builders (get_accelerator().get_op_builder({class_name!r}))")

    def build_extension(self) -> Any:
        unsupported("op builders (get_accelerator().build_extension())")
