#!/usr/bin/env bash
# What `make native` needs to compile the policy's hot modules: a C compiler and
# the headers of the interpreter the virtual environment runs (Debian: gcc,
# python3-dev). Idempotent; installs only what is missing, as root; never reads stdin.
set -euo pipefail
exec </dev/null
py=${1:-python3}
headers=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
[ -f "$headers/Python.h" ] || missing+=(python3-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-build-tools.sh: need ${missing[*]} (no $headers/Python.h or no cc);" \
        "install them, or run as root on Debian" >&2
    exit 1
fi
echo "install-build-tools.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
if [ ! -f "$headers/Python.h" ]; then
    echo "install-build-tools.sh: $headers/Python.h still missing: $py is not Debian's python3;" \
        "install its development headers" >&2
    exit 1
fi
