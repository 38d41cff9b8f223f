#!/bin/sh
# Runs one case of watchdog.py (torch's file timer and --hang_timeout with
# PyTorch scripts) with /usr/bin/python3, the Python that has torch on this
# image; exits 77 (skipped) without it.
python=/usr/bin/python3
if [ ! -x "$python" ]; then
  echo "skipped: $python not found (the watchdog cases run scripts with it; scripts/setup installs python3-torch)"
  exit 77
fi
exec "$python" "$(dirname "$0")/watchdog.py" "$@"
