# shellcheck shell=bash
# Sourced by start.sh and test.sh: make .venv (once) and install the project into it.
# Re-installs only when pyproject.toml has changed since the last install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)-$1
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[$1]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
