"""Rank 1 raises the user's own error after the engine is built; rank 0 trains on and loses its peer."""
import time

import torch

import zerorun

model = torch.nn.Linear(2, 2)
engine, *_ = zerorun.initialize(model=model, model_parameters=model.parameters(), config={
    "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
if engine.ctx.rank == 1:
    raise RuntimeError("boom: rank 1's own bug")
for _ in range(200):
    engine.backward(engine(torch.ones(1, 2)).sum())
    engine.step()
    time.sleep(0.05)
