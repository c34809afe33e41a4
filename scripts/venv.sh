#!/usr/bin/env bash
# Create .venv with Python 3.11 and install the pinned dependencies into it. Called by the Makefile when
# pyproject.toml or constraints.txt changed since the last install (or .venv does not exist).
#
# Finds Python 3.11 as `python3.11`, or as `python3` when that is 3.11 (Debian 12), and installs it with
# apt-get when neither is there. Exit status 0 when .venv is ready, non-zero with the reason otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
WANT=3.11

is_wanted() {  # is_wanted INTERPRETER: true when it exists and is Python $WANT
  command -v "$1" >/dev/null 2>&1 &&
    [ "$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$WANT" ]
}

find_python() {
  for candidate in "${PYTHON:-}" python3.11 python3; do
    if [ -n "$candidate" ] && is_wanted "$candidate"; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

if ! python=$(find_python); then
  echo "venv: no Python $WANT found; installing it"
  # Debian 12's python3 is 3.11; Ubuntu 22.04 ships python3.11 beside its default python3.
  bash scripts/apt-install.sh python3.11 python3.11-venv || true
  python=$(find_python) || {
    echo "venv: Python $WANT is required (pyproject.toml). Install it (e.g. Debian 12, or python3.11 from" \
      "your distribution or pyenv) and run make again, or set PYTHON=/path/to/python3.11." >&2
    exit 1
  }
fi

# A venv made by another interpreter version would import the wrong compiled wheels; start over then.
if [ -x "$VENV/bin/python" ] && ! is_wanted "$VENV/bin/python"; then
  echo "venv: $VENV is not Python $WANT; recreating it"
  rm -rf "$VENV"
fi

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$VENV"
  # Debian and Ubuntu split venv/ensurepip out of the interpreter package; `python3 -m venv` fails
  # (and leaves a half-made folder) until python3.11-venv is installed.
  if ! "$python" -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    echo "venv: the venv module is missing; installing python3.11-venv"
    bash scripts/apt-install.sh python3.11-venv
    "$python" -m venv "$VENV"
  fi
fi

echo "venv: installing pinned dependencies into $VENV (pip install -c constraints.txt -e '.[test]')"
# Playwright must drive the system's /usr/bin/chromium; never let anything fetch a browser build.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
