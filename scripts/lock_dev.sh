#!/usr/bin/env bash
# Refresh requirements/dev.txt, the constraints the README's test command and
# .ci/run install the dev set with (so a fresh machine gets what CI tested).
# Run it after changing a dependency in pyproject.toml; tests/test_lock.py
# fails while the two disagree. Needs pip-tools (pip install pip-tools) and the
# package index; the library's own ranges in pyproject.toml stay open.
#
#   scripts/lock_dev.sh            # writes requirements/dev.txt
#
# Resolved for the Python that runs it (CI's: 3.11). torch is pinned by version
# only (2.13.0, not 2.13.0+cpu): the build variant follows the machine's index,
# the CPU wheel here, a CUDA one on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=requirements/dev.txt
CUSTOM_COMPILE_COMMAND="scripts/lock_dev.sh" pip-compile --quiet --extra dev --strip-extras \
    --no-emit-index-url --no-emit-find-links --allow-unsafe --output-file "$out" pyproject.toml
# the project itself is installed from the checkout (-e .), never from the lock;
# a local version label (+cpu) would not resolve on a machine with another index
python3 - "$out" <<'PY'
import re
import sys
from pathlib import Path

path = Path(sys.argv[1])
lines, skip = [], False
for line in path.read_text().splitlines():
    if re.match(r"^genesis-fp16 @ ", line):
        skip = True
        continue
    if skip and line.startswith("    #"):
        continue
    skip = False
    lines.append(re.sub(r"^(torch==[^+\s]+)\+\S+", r"\1", line))
path.write_text("\n".join(lines) + "\n")
PY
echo "wrote $out"
