#!/usr/bin/env bash
# Install the named Debian/Ubuntu packages that are not installed yet; do nothing (and touch no network)
# when all are. Used by scripts/venv.sh and scripts/test-services.sh.
#
#   bash scripts/apt-install.sh PACKAGE...
#
# Exit status: 0 when every package is installed afterwards, 1 otherwise (with the reason on stderr).
set -euo pipefail

missing=()
for pkg in "$@"; do
  # dpkg-query answers from the local database, so the common case (all present) costs milliseconds.
  if [ "$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)" != "installed" ]; then
    missing+=("$pkg")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "apt-install: missing packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "apt-install: missing packages: ${missing[*]}, and this is not a Debian/Ubuntu system (no apt-get)" >&2
  exit 1
fi

echo "apt-install: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Package lists on a fresh machine are empty or stale; refresh them only now that something is needed.
apt-get update -qq
# --no-install-recommends keeps chromium from pulling a desktop's worth of printing and session tools;
# callers name every package they rely on.
apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
