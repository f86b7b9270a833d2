"""``zerorun autotune``: bucket and prefetch sizes chosen by short real trials.

space.py     the knobs per stage and their candidate values (hidden-size rules, log grid)
prune.py     candidates the memory estimate says cannot fit never run
protocol.py  the environment variables and result file shared with the engine
classify.py  a trial's outcome from its exit code and the engine's records
ledger.py    append-only JSON lines keyed by config + script: resume skips finished trials
search.py    coarse-to-fine search over a "run one trial" callable
results.py   the ranked trials, the dry-run plan, best.yaml
hook.py      the engine's two calls: the trial's knobs over the config, the step recorder
runner.py    one trial = one launcher run of the unchanged script, with a timeout
start.py     the starting config resolved: stage, starting knobs, memory context
tuner.py     baseline -> space -> search -> ledger -> best.yaml
args.py      the command line (the launcher's options plus autotune's)
display.py   rich progress and tables (imported by the CLI only)
"""
