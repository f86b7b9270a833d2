"""Running the plan: the executor, the per-node agents and shims, their channel, and the ranks' processes."""
