"""Planning, pure: hostfile, filters and flags -> the plan (nodes, ranks, env) -> one command per node."""
