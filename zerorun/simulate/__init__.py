"""``zerorun simulate``: the real engine as one rank of a large world, in one process.

The package's root is the simulated world itself (:mod:`~zerorun.simulate.fake_world`,
torch's fake process group), which the engine's bootstrap joins; it imports no engine
module. The drivers sit above the engine and are imported by their module name:

* :mod:`~zerorun.simulate.model`: the models it builds (built-in decoders, HF configs);
* :mod:`~zerorun.simulate.run`: set-up and K steps as rank r of N, every figure read;
* :mod:`~zerorun.simulate.peak`: the kernel's resident-set peak per phase;
* :mod:`~zerorun.simulate.compare`: the same figures from the estimate;
* :mod:`~zerorun.simulate.report`: the JSON document and the 80-column text.
"""

from __future__ import annotations

from zerorun.simulate.fake_world import (
    DEVICE_ENV,
    DEVICES,
    FAKE_BACKEND,
    RANK_ENV,
    WORLD_ENV,
    Device,
    Simulation,
    SimulationError,
    device_type,
    from_env,
    is_fake,
    join,
    world,
)

__all__ = ["DEVICES", "DEVICE_ENV", "FAKE_BACKEND", "RANK_ENV", "WORLD_ENV", "Device", "Simulation",
           "SimulationError", "device_type", "from_env", "is_fake", "join", "world"]
