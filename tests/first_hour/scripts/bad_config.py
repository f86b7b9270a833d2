"""Every rank reads the same bad config inside the script: one problem, raised alike by each rank."""
import torch

import zerorun

model = torch.nn.Linear(2, 2)
zerorun.initialize(model=model, model_parameters=model.parameters(),
                   config={"train_batch_size": 4, "zero_optimization": {"stage": 4}})
