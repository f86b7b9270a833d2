"""The zerorun launcher: hostfile -> plan -> per-node commands -> agents that run the ranks."""
