"""``gradient_allreduce_op: sum``: ranks add their gradients (DeepSpeed's plain sum, no division by the world size
and no ``gradient_predivide_factor``), so 2-rank SGD at lr equals single-process SGD at 2 x lr, step by step.

SGD with momentum is linear in the gradient (Adam would hide a scale), clipping is off (it is not),
and the stage-2 case also sets ``prescale_gradients`` with a predivide factor, which a sum ignores.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tests.dist_harness import assert_matches_reference, run_distributed
from tests.engine.test_engine_cases import SGD_LR, STEPS, Case, reference, train_case
from zerorun.config import load_config
from zerorun.config.problems import ConfigError

WORLD = 2


@dataclass(frozen=True)
class SumCase(Case):
    def config(self) -> dict:
        return {**super().config(), "gradient_allreduce_op": "SUM"}  # any letter case, as DeepSpeed reads it

    def make_reference_optimizer(self, params: list) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=SGD_LR * WORLD, momentum=0.9)


CASES = [SumCase(0, "fp32", 1, 0.0, optimizer="SGD"),
         SumCase(2, "fp32", 3, 0.0, overlap=True, optimizer="SGD", predivide=2.0)]


def _train(rank: int, world: int) -> dict:
    return {case.name: train_case(case, rank, world) for case in CASES}


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_distributed(_train, WORLD, timeout=240)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_sum_equals_single_process_at_world_times_the_lr(results: list[dict], case: SumCase) -> None:
    ref_losses, ref_params = reference(case, WORLD)
    assert_matches_reference(case, WORLD, [r[case.name] for r in results], STEPS, ref_losses, ref_params)


def test_mean_is_the_default_and_the_op_is_checked_as_deepspeed_does() -> None:
    assert load_config({"train_batch_size": 1}).gradient_allreduce_op == "mean"
    with pytest.raises(ValueError, match="Invalid gradient_allreduce_op"):
        load_config({"train_batch_size": 1, "gradient_allreduce_op": "max"})
    with pytest.raises(ConfigError, match="'sum' is not supported with ZeRO stage 3"):
        load_config({"train_batch_size": 1, "gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}})
    with pytest.raises(ConfigError, match="'sum' is not supported with DeepCompile"):
        load_config({"train_batch_size": 1, "gradient_allreduce_op": "sum", "compile": {"deepcompile": True}})
    with pytest.raises(ConfigError, match="'sum' is not supported with ZenFlow"):
        load_config({"train_batch_size": 1, "gradient_allreduce_op": "sum",
                     "zero_optimization": {"stage": 2, "zenflow": {}}})
