"""Communication: the process group's bootstrap, the counted collectives, the shared-memory lane,
the checking modes, and the training script's own collectives (``deepspeed.comm``)."""
