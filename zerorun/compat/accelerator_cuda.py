"""The CUDA accelerator: ``torch.cuda`` behind DeepSpeed's accelerator interface."""

from __future__ import annotations

from typing import Any

import torch

from zerorun.compat.accelerator_base import Accelerator


class CudaAccelerator(Accelerator):
    """``torch.cuda`` under DeepSpeed's accelerator names."""

    _name = "cuda"
    _communication_backend_name = "nccl"

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def set_device(self, device_index: int | str | torch.device) -> None:
        torch.cuda.set_device(device_index)

    def synchronize(self, device_index: int | None = None) -> None:
        torch.cuda.synchronize(device_index)

    def visible_devices_envs(self) -> list[str]:
        return ["CUDA_VISIBLE_DEVICES"]

    def export_envs(self) -> list[str]:
        return ["NCCL"]

    def is_triton_supported(self) -> bool:
        return self.is_available() and torch.cuda.get_device_capability()[0] >= 7

    def manual_seed(self, seed: int) -> None:
        torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.cuda.manual_seed_all(seed)

    def initial_seed(self) -> int:
        return torch.cuda.initial_seed()

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        return torch.cuda.get_rng_state() if device_index is None else torch.cuda.get_rng_state(device_index)

    def set_rng_state(self, new_state: torch.Tensor, device_index: int | None = None) -> None:
        if device_index is None:
            torch.cuda.set_rng_state(new_state)
        else:
            torch.cuda.set_rng_state(new_state, device_index)

    def default_generator(self, device_index: int) -> torch.Generator:
        return torch.cuda.default_generators[device_index]

    def is_bf16_supported(self) -> bool:
        return self.is_available() and torch.cuda.is_bf16_supported()

    def is_fp16_supported(self) -> bool:
        return self.is_available()

    # streams and events
    @property
    def Stream(self) -> Any:  # noqa: N802
        return torch.cuda.Stream

    def stream(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def current_stream(self, device_index: int | None = None) -> Any:
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index: int | None = None) -> Any:
        return torch.cuda.default_stream(device_index)

    @property
    def Event(self) -> Any:  # noqa: N802
        return torch.cuda.Event

    # memory
    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_allocated(device_index)

    def reset_max_memory_allocated(self, device_index: int | None = None) -> None:
        torch.cuda.reset_peak_memory_stats(device_index)

    def memory_reserved(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_reserved(device_index)

    def max_memory_reserved(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_reserved(device_index)

    memory_cached = memory_reserved
    max_memory_cached = max_memory_reserved

    def reset_max_memory_cached(self, device_index: int | None = None) -> None:
        torch.cuda.reset_peak_memory_stats(device_index)

    def memory_stats(self, device_index: int | None = None) -> dict[str, Any]:
        return torch.cuda.memory_stats(device_index)

    def reset_peak_memory_stats(self, device_index: int | None = None) -> None:
        torch.cuda.reset_peak_memory_stats(device_index)

    def total_memory(self, device_index: int | None = None) -> int:
        # None is the current device (as every other query here), not device 0
        index = torch.cuda.current_device() if device_index is None else device_index
        return torch.cuda.get_device_properties(index).total_memory

    def available_memory(self, device_index: int | None = None) -> int:
        return torch.cuda.mem_get_info(device_index)[0]

    def amp(self) -> Any:
        return torch.amp

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor.pin_memory()

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned()

    def range_push(self, msg: str) -> None:
        torch.cuda.nvtx.range_push(msg)

    def range_pop(self) -> None:
        torch.cuda.nvtx.range_pop()
