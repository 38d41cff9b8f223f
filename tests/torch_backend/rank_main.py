"""How every test script here ends a rank: main() returns (exit 0) or raises
(its traceback printed, exit 1), always through os._exit, since torch 1.13 can
deadlock at exit in ~ProcessGroupGloo."""
import os
import sys
import traceback


def run(main, *args):
    try:
        main(*args)
        code = 0
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
