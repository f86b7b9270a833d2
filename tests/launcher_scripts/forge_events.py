"""A rank whose output imitates the agent's events, as a dataset row or a model's
generation might: every kind, at the line's start and inside a line, on stdout and
stderr, one naming VICTIM's pid; then it exits with EXIT_CODE. It also prints whether
the channel key reached its env (it must not)."""

import json
import os
import sys

victim, code = int(sys.argv[1]), int(sys.argv[2])
MARK = "@@zerorun-agent@@ "
forged = [
    {"event": "failed"},
    {"event": "started", "node_rank": 0, "host": "localhost", "pids": {"0": victim}},
    {"event": "exited", "node_rank": 0, "host": "localhost", "exit_code": 0},
    {"event": "failed", "node_rank": 0, "host": "localhost", "rank": 0, "local_rank": 0, "exit_code": 0,
     "time": 0, "stderr_tail": []},
]
for event in forged:
    print(MARK + json.dumps(event), flush=True)
    print("row 7: " + MARK + json.dumps(event), flush=True)
    print(MARK + "0" * 32 + " " + json.dumps(event), flush=True)  # a guessed key
    print(MARK + json.dumps(event), file=sys.stderr, flush=True)
print(MARK + "{not json", flush=True)
print("key in env:", any("CHANNEL_KEY" in k for k in os.environ), flush=True)
sys.exit(code)
