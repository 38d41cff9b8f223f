#!/usr/bin/python3
"""`ddprun status --watch` driven in tmux against a real 2-node job that loses a node.

A 2-node c10d job on loopback (2 agents x 2 ranks of ddprun_progress_worker,
--nnodes=1:2, live views on free ports: tests/status/live_view_test.py's Job)
is watched from a shell in a detached tmux session (its own server socket):

  1. `ddprun status --watch 1 URL0 URL1` is typed into the shell (send-keys);
     the pane (capture-pane) shows both agents running, nodes 0 and 1, and
     ranks 0-3 with their step times.
  2. Node 1 (its agent and workers) is SIGKILLed while the view runs; the pane
     then shows its URL unreachable (connection refused), node 1 LOST in node
     0's view, and the banner naming both. The pane is saved to
     $DDP_STATUS_CAPTURE when that is set.
  3. `q` quits: the shell's screen is back (no alternate screen, the cursor
     shown, the view gone), and the shell runs the next command.
  4. The view again (one URL), ended by Ctrl-C: the terminal is as clean.

Everything started is stopped at the end (tmux server, agents, workers).
Exit status 0 when it passed, 1 when it failed (saying what), 77 (skipped)
without tmux. Binaries come from $DDP_BUILD_BIN (else build/bin).
"""
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "status"))
from live_view_test import Failure, Job, bin_dir, check, wait_until  # noqa: E402

SKIP = 77
WIDTH, HEIGHT = 120, 40


class Tmux:
    """A detached tmux session running a plain shell, on a server of its own."""

    def __init__(self):
        self.socket = f"ddp_status_view_{os.getpid()}"
        self.tmux("new-session", "-d", "-s", "view", "-x", str(WIDTH), "-y", str(HEIGHT),
                  "env -i PATH=/usr/bin:/bin TERM=xterm-256color PS1='$ ' "
                  "bash --norc --noprofile")

    def tmux(self, *args):
        result = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                                text=True, timeout=10)
        if result.returncode != 0:
            raise Failure(f"tmux {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def type(self, *keys):
        self.tmux("send-keys", "-t", "view", *keys)

    def pane(self):
        return self.tmux("capture-pane", "-p", "-t", "view")

    def flag(self, name):
        return self.tmux("display-message", "-p", "-t", "view", "#{" + name + "}").strip()

    def wait_for(self, predicate, timeout, what):
        """The first pane that satisfies `predicate`."""

        def satisfied():
            pane = self.pane()
            return pane if predicate(pane) else None

        try:
            return wait_until(satisfied, timeout, what, poll=0.2)
        except Failure as e:
            raise Failure(f"{e}; the pane shows:\n{self.pane()}") from None

    def clean_after_quit(self, how):
        """The watch ended: the shell's own screen, cursor shown, a command runs."""
        wait_until(lambda: self.flag("alternate_on") == "0", 5, f"the alternate screen to end ({how})")
        check(self.flag("cursor_flag") == "1", f"the cursor is hidden after {how}")
        self.type("echo back-$((6*7))", "Enter")
        pane = self.wait_for(lambda p: "back-42" in p, 5, f"the shell to answer after {how}")
        check("NODES, as" not in pane, f"the view is left on the screen after {how}:\n{pane}")

    def close(self):
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


def row_of(pane, first_cells):
    """The pane's line whose first cells (split on blanks) are `first_cells`."""
    for line in pane.splitlines():
        cells = line.split()
        if cells[:len(first_cells)] == first_cells:
            return cells
    return None


def shows_job(pane, urls):
    nodes = row_of(pane, ["0"]) and row_of(pane, ["1"])
    ranks = all(row_of(pane, [str(r), str(r // 2)]) for r in range(4))
    agents = all((row_of(pane, [u]) or [None, None, None, None])[3] == "running" for u in urls)
    return nodes and ranks and agents and "alive" in pane and "self" in pane


def run():
    started = time.monotonic()
    ddprun = os.path.abspath(os.path.join(bin_dir(), "ddprun"))
    tmux = None
    with Job() as job:
        try:
            docs = job.formed()
            nodes = job.by_group_rank(docs)
            survivor, victim = nodes[0], nodes[1]
            urls = [survivor.url, victim.url]
            tmux = Tmux()
            tmux.type(f"{shlex.quote(ddprun)} status --watch 1 {urls[0]} {urls[1]}", "Enter")
            tmux.wait_for(lambda p: shows_job(p, urls), 10, "the view of both nodes and 4 ranks")
            check(tmux.flag("alternate_on") == "1", "the view is not on the alternate screen")
            pane = tmux.pane()
            for r in range(4):
                step = row_of(pane, [str(r), str(r // 2)])[6]
                check(step.endswith("s"), f"rank {r}'s step time is '{step}':\n{pane}")

            victim.kill()

            def shows_loss(p):
                agent = row_of(p, [urls[1]])
                node = row_of(p, ["1"])
                return (agent and "UNREACHABLE: connection refused" in " ".join(agent) and
                        node and node[4] == "LOST" and "PROBLEM:" in p)

            pane = tmux.wait_for(shows_loss, 15, "node 1 shown lost and its agent unreachable")
            banner = next(line for line in pane.splitlines() if line.startswith("PROBLEM:"))
            check(f"agent {urls[1]} (node 1) does not answer" in banner and "node 1" in banner,
                  f"banner: {banner}")
            if os.environ.get("DDP_STATUS_CAPTURE"):
                with open(os.environ["DDP_STATUS_CAPTURE"], "w") as f:
                    f.write(pane)
            tmux.type("q")
            tmux.clean_after_quit("q")

            tmux.type(f"{shlex.quote(ddprun)} status --watch 1 {urls[0]}", "Enter")
            tmux.wait_for(lambda p: row_of(p, [urls[0]]) is not None, 10, "the view again")
            tmux.type("C-c")
            tmux.clean_after_quit("Ctrl-C")
        finally:
            if tmux:
                tmux.close()
    print(f"status_view: both nodes, then node 1 lost, shown in tmux; q and Ctrl-C left the "
          f"terminal clean ({time.monotonic() - started:.1f} s)")


def main():
    # ctest's timeout and Ctrl-C leave through the with-block, which stops the job.
    for signo in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signo, lambda s, _f: sys.exit(128 + s))
    if not shutil.which("tmux"):
        print("status_view: skipped: tmux not installed (scripts/setup installs it)")
        return SKIP
    try:
        run()
        return 0
    except Failure as e:
        print(f"status_view: FAILED: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
