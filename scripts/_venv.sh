# shellcheck shell=bash
# Sourced by start.sh and test.sh: make .venv (once) and install the project into it.
# Re-installs only when pyproject.toml has changed since the last install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
# A .venv without pip is half made (python3-venv missing on Debian or Ubuntu: venv made the
# folder, then ensurepip failed): make it again rather than fail the same way every time.
if [ ! -x .venv/bin/python ] || [ ! -x .venv/bin/pip ]; then
  rm -rf .venv
  if ! "$PYTHON" -m venv .venv || [ ! -x .venv/bin/pip ]; then
    rm -rf .venv
    echo "error: '$PYTHON -m venv' could not make .venv with pip (Debian, Ubuntu: apt-get install python3-venv)" >&2
    exit 1
  fi
fi
project=$(sha256sum pyproject.toml | cut -c1-16)
stamp=.venv/.installed-$project-$1
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[$1]"
  # stamps of an older pyproject.toml go; the other extra's stays (start.sh and test.sh take turns)
  find .venv -maxdepth 1 -name '.installed-*' ! -name ".installed-$project-*" -delete
  touch "$stamp"
fi
