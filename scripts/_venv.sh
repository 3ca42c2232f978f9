# shellcheck shell=bash
# Sourced by start.sh and test.sh: make .venv (once) and install into it the lock file of the
# set asked for (requirements/runtime.txt or dev.txt: exact versions, every file's hash checked)
# and of the build backend (build.txt), then this checkout, editable. Installs again only when
# pyproject.toml, a lock file or the version (wire/__init__.py, the package's metadata) changed.
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
project=$({ cat pyproject.toml requirements/*.txt; grep -s '^__version__' wire/__init__.py || true; } \
  | sha256sum | cut -c1-16)
stamp=.venv/.installed-$project-$1
if [ ! -f "$stamp" ]; then
  install=(.venv/bin/python -m pip install --quiet)
  if [ "$1" = dev ]; then
    # the dev set's own uv, locked with its hashes, installs the rest in seconds (pip: about 50 s)
    awk '/^uv==/ {on = 1; print; next} on && /^ / {print; next} {on = 0}' requirements/dev.txt >.venv/uv.txt
    "${install[@]}" --require-hashes --no-deps -r .venv/uv.txt
    install=(.venv/bin/uv pip install --quiet --python .venv/bin/python)
  fi
  "${install[@]}" --require-hashes --no-deps -r "requirements/$1.txt" -r requirements/build.txt
  # the dependencies and the build backend are all locked: nothing unpinned comes in with the checkout
  "${install[@]}" --no-deps --no-build-isolation -e .
  # stamps of an older pyproject.toml go; the other set's stays (start.sh and test.sh take turns)
  find .venv -maxdepth 1 -name '.installed-*' ! -name ".installed-$project-*" -delete
  touch "$stamp"
fi
