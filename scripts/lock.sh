#!/usr/bin/env bash
# Refresh the lock files requirements/*.txt from pyproject.toml: every package at an exact
# version with the hashes of its files, for Python 3.11 and newer on any platform. Run it after
# changing the dependencies in pyproject.toml; `scripts/lock.sh --upgrade` takes the newest
# versions pyproject.toml allows. Needs uv (in the dev set: scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-.venv/bin/uv}
# runtime: the servers and the client (the image, the VM, start.sh); sim: and market-sim's
# plots (the image's sim stage); dev: every extra, the tests and the linters (test.sh).
for set in runtime sim dev; do
  "$uv" pip compile pyproject.toml --extra "$set" --universal --python-version 3.11 \
    --generate-hashes --no-strip-extras --custom-compile-command scripts/lock.sh --quiet \
    --output-file "requirements/$set.txt" "$@"
done
