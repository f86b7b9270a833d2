#!/usr/bin/env bash
# The tests' set-up, on top of the main job's (scripts/setup.sh): the ssh server, pdsh,
# Slurm (slurmctld + slurmd + clients; the tests start their own one-node cluster from a
# private slurm.conf, no system service is configured), Open MPI's mpirun and nftables' nft that the
# launcher tests use (apt, root or sudo), then the dev extras (pytest, ruff, the Hugging
# Face stack the script tests run) in the same `.venv`. Only what pyproject.toml declares
# is in that environment, so a dependency the code uses without declaring it fails the
# tests. Safe to run again; apt's own output goes to a log file, named below.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v pdsh >/dev/null 2>&1 || need_apt+=(pdsh)
command -v ssh-keygen >/dev/null 2>&1 || need_apt+=(openssh-client)
{ command -v slurmctld && command -v slurmd && command -v salloc; } >/dev/null 2>&1 \
    || { [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v salloc >/dev/null 2>&1; } \
    || need_apt+=(slurm-wlm)
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need_apt+=(nftables)  # the doctor's dropped-port test
if [ ${#need_apt[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    LOG=${TMPDIR:-/tmp}/zerorun-apt.log
    echo "zerorun: apt-get install ${need_apt[*]} (its output: $LOG)"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"; } \
        >"$LOG" 2>&1 || { tail -20 "$LOG" >&2; echo "zerorun: apt-get failed, the whole log: $LOG" >&2; exit 1; }
fi

bash scripts/setup.sh
VENV=${ZERORUN_VENV:-.venv}
"$VENV/bin/python" -m pip install -q -e ".[dev]"
echo "zerorun: the test set-up is in $VENV (run $VENV/bin/python -m pytest -q)"
