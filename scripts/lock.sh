#!/usr/bin/env bash
# Refresh the lock files requirements/*.txt from pyproject.toml: every package at an exact
# version with the hashes of its files, for Python 3.11 and newer on any platform. Run it after
# changing the dependencies in pyproject.toml; `scripts/lock.sh --upgrade` takes the newest
# versions pyproject.toml allows. Needs uv (in the dev set: scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-.venv/bin/uv}
# runtime: the servers and the client (the image, the VM, start.sh); sim: and market-sim's
# plots (the image's sim stage); dev: every extra, the tests and the linters (test.sh);
# build: what builds the project's own package.
options=(--universal --python-version 3.11 --generate-hashes --custom-compile-command scripts/lock.sh --quiet)
for set in runtime sim dev; do
  "$uv" pip compile pyproject.toml --extra "$set" --no-strip-extras "${options[@]}" \
    --output-file "requirements/$set.txt" "$@"
done
# build: the build backend of pyproject.toml's [build-system], so that installing the checkout
# itself (pip's --no-build-isolation) fetches nothing unpinned either
"${PYTHON:-python3}" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
  | "$uv" pip compile - "${options[@]}" --output-file requirements/build.txt "$@"
