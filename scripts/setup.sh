#!/usr/bin/env bash
# Installs everything zerorun and its tests need on a fresh Debian machine:
# the ssh server and pdsh the launcher tests use, the CPU build of torch, and the
# project itself in editable mode with its dev extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v pdsh >/dev/null 2>&1 || need_apt+=(pdsh)
command -v ssh-keygen >/dev/null 2>&1 || need_apt+=(openssh-client)
if [ ${#need_apt[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

PY=${PYTHON:-python3}
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q -e ".[dev]"
