#!/usr/bin/env bash
# Create the project's virtual environment, installing Debian's python3-venv
# first when the interpreter cannot make one (a fresh Debian 12 lacks it).
set -euo pipefail
py=${1:-python3}
venv=${2:-.venv}
if ! command -v "$py" >/dev/null 2>&1; then
    echo "bootstrap: $py not found; installing Debian's python3" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
    py=python3
fi
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "bootstrap: rackguard needs Python >= 3.11; $("$py" --version) found" >&2
    exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
    if ! "$py" -m venv "$venv" 2>/dev/null; then
        echo "bootstrap: installing python3-venv (Debian)" >&2
        rm -rf "$venv"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        "$py" -m venv "$venv"
    fi
fi
