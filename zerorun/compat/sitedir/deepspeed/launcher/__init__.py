"""``deepspeed.launcher``: the ``zerorun`` CLI is the launcher; ``runner`` holds the names integrations read."""
