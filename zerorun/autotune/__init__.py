"""``zerorun autotune``: bucket and prefetch sizes chosen by short real trials.

space.py     the knobs per stage and their candidate values (hidden-size rules, log grid)
prune.py     candidates the memory estimate says cannot fit never run
protocol.py  the environment variables and result file shared with the engine
classify.py  a trial's outcome from its exit code and the engine's records
ledger.py    append-only JSON lines keyed by config + script: resume skips finished trials
search.py    coarse-to-fine search over a "run one trial" callable
"""
