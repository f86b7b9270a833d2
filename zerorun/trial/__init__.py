"""The contract between a trial process and the tuner that starts it (``zerorun autotune``).

The tuner writes a trial's knobs and paths into ``ZERORUN_TRIAL_*`` variables; the engine,
inside the trial, reads them (:mod:`zerorun.engine.trial`) and writes the result file the
tuner reads. Neither side imports the other: both import this package.
"""
