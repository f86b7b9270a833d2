"""Ranks meet at a gloo barrier; then one rank fails (exit code or a signal) and the
others sleep forever, as ranks blocked in an NCCL collective would: nothing but the
launcher can end them. Each rank writes its pid to PID_DIR/rank<R>.pid first."""

import argparse
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int)  # passed by the launcher, as DeepSpeed's does
p.add_argument("--pid_dir", required=True)
p.add_argument("--fail_rank", type=int, default=-1)
p.add_argument("--exit_code", type=int, default=7)
p.add_argument("--signal", default=None, help="e.g. SIGKILL: the failing rank kills itself")
p.add_argument("--no_torch", action="store_true", help="skip the gloo barrier (teardown tests that need no group)")
p.add_argument("--ignore_sigint", action="store_true", help="survive a forwarded Ctrl-C (a second one kills)")
args = p.parse_args()
if args.ignore_sigint:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
rank = int(os.environ["RANK"])
if not args.no_torch:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
with open(os.path.join(args.pid_dir, f"rank{rank}.pid"), "w") as fh:
    fh.write(str(os.getpid()))
if rank == args.fail_rank:
    time.sleep(0.5)  # let every rank write its pid first
    with open(os.path.join(args.pid_dir, "failed_at"), "w") as fh:
        fh.write(repr(time.time()))
    print(f"rank {rank} fails now", file=sys.stderr, flush=True)
    if args.signal:
        os.kill(os.getpid(), getattr(signal, args.signal))
    sys.exit(args.exit_code)
while True:
    time.sleep(3600)
