#!/bin/sh
# A shell wrapper as users write them for `torchrun --no_python`: it picks the
# interpreter and adds an argument of its own.
set -e
exec "${PYTHON_EXEC:-python3}" -u "$(dirname "$0")/trainpkg/collect.py" --via=wrapper "$@"
