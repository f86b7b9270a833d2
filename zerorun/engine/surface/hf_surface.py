"""Engine methods that Hugging Face's Trainer and accelerate call on DeepSpeed's engine.

Mixed into :class:`zerorun.engine.engine.Engine`. ``Trainer.save_model`` (through
``accelerator.get_state_dict``) asks whether stage 3 may gather the 16-bit weights and
then for the consolidated state dict; both read the engine's own config and parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from zerorun.engine.views import ModelView


class HfSurface:
    def zero_gather_16bit_weights_on_model_save(self: ModelView) -> bool:
        """``zero_optimization.stage3_gather_16bit_weights_on_model_save``."""
        return bool(self.config.zero_optimization.stage3_gather_16bit_weights_on_model_save)

    def _zero3_consolidated_16bit_state_dict(self: ModelView, exclude_frozen_parameters: bool = False
                                             ) -> dict[str, torch.Tensor] | None:
        """The full 16-bit state dict on rank 0 and ``None`` elsewhere, as DeepSpeed's; every rank calls it."""
        from zerorun.engine.checkpoint.save16 import consolidated_state_dict

        state = consolidated_state_dict(self, exclude_frozen_parameters)
        return state if self.ctx.rank == 0 else None
