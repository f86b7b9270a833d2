"""Host checks before a launch: the probes, their verdicts, the real collective and the ssh preflight."""
