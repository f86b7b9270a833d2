"""``deepspeed.accelerator.get_accelerator()``: the device API DeepSpeed scripts call.

Two implementations behind one interface: CUDA (``torch.cuda``) and CPU (ranks on gloo,
memory figures from psutil, as DeepSpeed's CPU accelerator reports them). The choice is
``DS_ACCELERATOR`` (``cuda``/``cpu``) if set, else CUDA when it is available. Device
names, ``communication_backend_name()`` and the dtype answers are DeepSpeed's.
"""

from __future__ import annotations

import functools
import os
import resource
from typing import Any

import psutil
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
        return torch.cuda.get_device_properties(device_index or 0).total_memory

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


class _NoStream:
    """CPU work is synchronous: a stream that is a no-op context, as DeepSpeed's CPU accelerator."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _NoStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


class CpuAccelerator(Accelerator):
    """Ranks on CPU (gloo). Memory is the process's, from psutil."""

    _name = "cpu"
    _communication_backend_name = "gloo"

    def is_synchronized_device(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        # DeepSpeed counts CPU "devices" per node from the launcher's environment
        return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", "1")))

    def current_device(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def device_name(self, device_index: int | None = None) -> str:
        return "cpu"  # torch has one CPU device; DeepSpeed names it "cpu" whatever the index

    def current_device_name(self) -> str:
        return "cpu"

    def set_device(self, device_index: int | str | torch.device) -> None:
        """One CPU device: nothing to select."""

    def synchronize(self, device_index: int | None = None) -> None:
        """CPU kernels are synchronous."""

    def is_bf16_supported(self) -> bool:
        return True

    def is_fp16_supported(self) -> bool:
        return True

    Stream = _NoStream
    Event = _NoStream

    def stream(self, stream: Any) -> _NoStream:
        return _NoStream()

    def current_stream(self, device_index: int | None = None) -> _NoStream:
        return _NoStream()

    def default_stream(self, device_index: int | None = None) -> _NoStream:
        return _NoStream()

    def empty_cache(self) -> None:
        """No caching allocator on CPU."""

    def memory_allocated(self, device_index: int | None = None) -> int:
        return psutil.Process().memory_info().rss

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        # the process's peak resident set (Linux reports KiB); never below the current one
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(peak, self.memory_allocated())

    def reset_max_memory_allocated(self, device_index: int | None = None) -> None:
        """The kernel's peak resident set cannot be reset."""

    memory_reserved = memory_allocated
    max_memory_reserved = max_memory_allocated
    memory_cached = memory_allocated
    max_memory_cached = max_memory_allocated
    reset_max_memory_cached = reset_max_memory_allocated
    reset_peak_memory_stats = reset_max_memory_allocated

    def memory_stats(self, device_index: int | None = None) -> dict[str, Any]:
        return {"allocated_bytes.all.current": self.memory_allocated(),
                "allocated_bytes.all.peak": self.max_memory_allocated()}

    def total_memory(self, device_index: int | None = None) -> int:
        return psutil.virtual_memory().total

    def available_memory(self, device_index: int | None = None) -> int:
        return psutil.virtual_memory().available

    def amp(self) -> Any:
        return torch.cpu.amp

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor  # nothing to pin for a CPU device

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned() if torch.cuda.is_available() else False


_KINDS = {"cuda": CudaAccelerator, "cpu": CpuAccelerator}


@functools.cache
def _accelerator(kind: str) -> Accelerator:
    return _KINDS[kind]()


def get_accelerator() -> Accelerator:
    """This process's accelerator: ``DS_ACCELERATOR`` if set, else CUDA if available, else CPU."""
    kind = os.environ.get("DS_ACCELERATOR", "").strip().lower()
    if kind and kind not in _KINDS:
        unsupported(f"accelerator {kind!r} (DS_ACCELERATOR)", "set DS_ACCELERATOR to cuda or cpu, or unset it")
    return _accelerator(kind or ("cuda" if torch.cuda.is_available() else "cpu"))


def set_accelerator(accel_obj: Any) -> None:
    unsupported("custom accelerators (deepspeed.accelerator.set_accelerator)")


def is_current_accelerator_supported() -> bool:
    return True


__all__ = ["Accelerator", "CpuAccelerator", "CudaAccelerator", "get_accelerator", "is_current_accelerator_supported",
           "set_accelerator"]
