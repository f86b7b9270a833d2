"""Running the plan: the executor, the per-node agents and shims, and the ranks' processes."""
