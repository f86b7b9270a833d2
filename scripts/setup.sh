#!/usr/bin/env bash
# Installs everything zerorun and its tests need on a fresh Debian machine: the ssh
# server, pdsh, Slurm (slurmctld + slurmd + clients; the tests start their own one-node
# cluster from a private slurm.conf, no system service is configured) and Open MPI's
# mpirun that the launcher tests use, then a fresh virtual environment `.venv`
# holding the CPU build of torch and the project (editable, with its dev extras).
# Only what pyproject.toml declares is in that environment, so a dependency the code
# uses without declaring it fails the tests. Safe to run again.
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
if [ ${#need_apt[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

VENV=${ZERORUN_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q -e ".[dev]"
