#!/usr/bin/python3
"""The live view of real jobs, checked with the real tools users point at it.

One case per run (the first argument), each against real processes on
loopback that the case starts and always stops:

  metrics     a 2-node c10d job (2 agents x 2 ranks of ddprun_progress_worker):
              each agent's /metrics passes `promtool check metrics`, says
              2 nodes in the round and 4 ranks; /livez and /readyz are 200;
              /status names both nodes and every rank
  prometheus  the same job scraped by a real Prometheus server (loopback,
              1 s interval): its query API returns the job's 2 members
  browser     headless Chromium shows the page of node 0 with both nodes; node 1
              is killed (its agent and workers, SIGKILL) and the page shows it
              lost within 2 s of node 0's verdict; screenshots before and after
              go to --out (kept) or a temporary directory (removed)
  hostile     against a running agent: unknown paths, POST, a 64 KiB header, a
              body, 1,000 idle connections (a scrape still answers within 1 s
              and the workers keep stepping), a client that never finishes its
              request (closed by the idle timeout)
  hang        rank 3 blocks before a collective (--hang_timeout=3): both nodes' /status
              show the incident, the hang event and the restart it cost; /metrics
              counts it
  token       an agent listening beyond loopback (0.0.0.0) with a store token
              (DDP_STORE_TOKEN): no token or a wrong one is 401, the Bearer
              header or ?token= is 200
  daemon      ddp-rendezvous --status-port 0 with 3 agents' worth of clients:
              promtool passes, /status and the page's daemon view

Binaries come from $DDP_BUILD_BIN (else build/bin); tests/status/browser.py drives
Chromium. Exit status 0 when the case
passed, 1 when it failed (saying what), 77 (skipped, saying why) when a tool it
needs (promtool, prometheus, chromium) is missing.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SKIP = 77
URL_LINE = re.compile(r"live view at (http://\S+/)")


class Failure(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failure(what)


def bin_dir():
    return os.environ.get("DDP_BUILD_BIN") or os.path.join(HERE, "..", "..", "build", "bin")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, method="GET", headers=None, timeout=5.0, data=None):
    """(status, body text, headers) of one request; HTTP errors are answers too."""
    request = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read().decode(), dict(reply.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def wait_until(predicate, timeout, what, poll=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise Failure(f"timed out after {timeout} s waiting for {what}")


class Agent:
    """One ddprun agent (one node), in its own process group, its output kept."""

    def __init__(self, args, env=None, name="agent"):
        self.name = name
        self.lines = []
        self.url = None
        self._lock = threading.Lock()
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen([os.path.join(bin_dir(), "ddprun")] + args,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=full_env, start_new_session=True, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))
                match = URL_LINE.search(line)
                if match and self.url is None:
                    self.url = match.group(1)

    def output(self):
        with self._lock:
            return "\n".join(self.lines)

    def wait_url(self, timeout=30):
        return wait_until(lambda: self.url, timeout, f"{self.name}'s live view URL:\n{self.output()}")

    def status(self):
        code, body, _ = http(self.url + "status")
        check(code == 200, f"{self.name} /status answered {code}: {body}")
        return json.loads(body)

    def kill(self):
        """SIGKILL to the agent's group: the agent and its workers (a lost node)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything of its group left behind
        except (ProcessLookupError, PermissionError):
            pass
        self._reader.join(timeout=5)


class Job:
    """A 2-node c10d job on loopback; the nodes meet in node 0's embedded store."""

    def __init__(self, nodes=2, nproc=2, status_host=None, env=None, worker_args=None,
                 hang_timeout=0):
        self.hang_timeout = hang_timeout
        self.port = free_port()
        self.agents = []
        # The run's files (a hang's incident is kept after the run) go here, removed in stop().
        self.log_dir = tempfile.mkdtemp(prefix="live_view_logs_")
        worker = [os.path.join(bin_dir(), "ddprun_progress_worker")] + (
            worker_args or ["slow", "3", "0", "--steps", "100000", "--step_ms", "40"])
        try:
            self._start(nodes, nproc, status_host, env, worker)
        except BaseException:
            self.stop()  # the agents started so far
            raise

    def _start(self, nodes, nproc, status_host, env, worker):
        for i in range(nodes):
            args = [f"--nnodes=1:{nodes}", f"--nproc_per_node={nproc}", "--rdzv_backend=c10d",
                    f"--rdzv_endpoint=127.0.0.1:{self.port}", f"--rdzv_id=live{self.port}",
                    # a lost node is declared after 4 x 0.5 s; admitted nodes wait no last call
                    "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=4,"
                    "last_call_timeout=1,join_timeout=60",
                    "--max_restarts=3", "--stop_grace=5", f"--hang_timeout={self.hang_timeout}",
                    "--status_port=0", f"--log_dir={self.log_dir}", "--no_python"]
            if status_host:
                args.append(f"--status_host={status_host}")
            # node 0 is started first, so that it hosts the store
            self.agents.append(Agent(args + worker, env=env, name=f"agent {i}"))
            if i == 0:
                self.agents[0].wait_url()
        for a in self.agents:
            a.wait_url()

    def formed(self, timeout=60):
        """Waits until every agent runs its workers in a round of every node."""
        n = len(self.agents)

        def all_running():
            try:
                docs = [a.status() for a in self.agents]
            except (OSError, Failure):
                return None
            ok = all(d["state"] == "running" and d["round"] and d["round"]["group_world_size"] == n
                     and len(d["ranks"]) == 2 * n for d in docs)
            return docs if ok else None

        return wait_until(all_running, timeout, "the job to form with every node:\n" +
                          "\n".join(a.output() for a in self.agents))

    def by_group_rank(self, docs):
        return {d["node"]["group_rank"]: a for a, d in zip(self.agents, docs)}

    def stop(self):
        for a in reversed(self.agents):
            a.stop()
        shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def promtool(text):
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def metric_value(text, name, labels=""):
    pattern = re.compile(r"^" + re.escape(name + labels) + r" (\S+)$", re.M)
    match = pattern.search(text)
    return float(match.group(1)) if match else None


# ---- cases -----------------------------------------------------------------------------------

def case_metrics(args):
    if not shutil.which("promtool"):
        return SKIP, "promtool not installed (scripts/setup installs prometheus)"
    with Job() as job:
        job.formed()
        for agent in job.agents:
            code, text, headers = http(agent.url + "metrics")
            check(code == 200, f"{agent.name} /metrics answered {code}")
            check(headers.get("Content-Type", "").startswith("text/plain; version=0.0.4"),
                  f"content type {headers.get('Content-Type')}")
            rc, remarks = promtool(text)
            check(rc == 0 and remarks == "", f"promtool on {agent.name}: rc {rc}: {remarks}")
            check(metric_value(text, "ddprun_round_nodes") == 2, "ddprun_round_nodes is not 2")
            check(metric_value(text, "ddprun_world_size") == 4, "ddprun_world_size is not 4")
            check(metric_value(text, "ddprun_members", '{state="self"}') == 1, "self member")
            check(metric_value(text, "ddprun_members", '{state="alive"}') == 1, "alive member")
            check(metric_value(text, "ddprun_ready") == 1, "not ready")
            check(metric_value(text, "process_resident_memory_bytes") > 0, "no process RSS")
            for path in ("livez", "readyz"):
                code, body, _ = http(agent.url + path)
                check(code == 200 and json.loads(body) == {"health": "true", "reason": ""},
                      f"{agent.name} /{path}: {code} {body}")
            doc = agent.status()
            check(sorted(m["node"] for m in doc["members"]) == [0, 1], f"members {doc['members']}")
            check(sorted(r["rank"] for r in doc["ranks"]) == [0, 1, 2, 3], "ranks")
        print("metrics: promtool passed on both agents; 2 nodes, 4 ranks, live and ready")
    return 0, ""


def case_prometheus(args):
    if not shutil.which("prometheus"):
        return SKIP, "prometheus not installed (scripts/setup installs it)"
    work = tempfile.mkdtemp(prefix="ddp_prom_")
    server = None
    try:
        with Job() as job:
            job.formed()
            targets = [a.url.split("//")[1].rstrip("/") for a in job.agents]
            with open(os.path.join(work, "prometheus.yml"), "w") as f:
                f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                        "scrape_configs:\n  - job_name: ddprun\n    static_configs:\n"
                        f"      - targets: {json.dumps(targets)}\n")
            port = free_port()
            server = subprocess.Popen(
                ["prometheus", f"--config.file={work}/prometheus.yml",
                 f"--storage.tsdb.path={work}/data", f"--web.listen-address=127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "log"), "w"),
                start_new_session=True)
            query = f"http://127.0.0.1:{port}/api/v1/query?query=" + urllib.request.quote(
                'sum by (instance) (ddprun_members{state=~"self|alive"})')

            def answered():
                try:
                    code, body, _ = http(query)
                except OSError:
                    return None
                if code != 200:
                    return None
                result = json.loads(body)["data"]["result"]
                return result if len(result) == 2 else None

            result = wait_until(answered, 60, "Prometheus to scrape both agents")
            values = sorted(float(r["value"][1]) for r in result)
            check(values == [2.0, 2.0], f"member counts from Prometheus: {result}")
            print(f"prometheus: the query API returns 2 members from each of {targets}")
    finally:
        if server:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0, ""


def case_browser(args):
    if not shutil.which("chromium"):
        return SKIP, "chromium not installed (scripts/setup installs it)"
    from browser import Browser
    out = args.out or tempfile.mkdtemp(prefix="ddp_page_")
    try:
        with Job() as job, Browser() as browser:
            docs = job.formed()
            nodes = job.by_group_rank(docs)
            survivor, victim = nodes[0], nodes[1]
            browser.open(survivor.url)
            browser.wait_for('document.querySelectorAll("#members tr[data-node]").length >= 2 && '
                             '!!document.querySelector(\'#members tr[data-node="1"][data-state="alive"]\')',
                             timeout=10)
            hosts = browser.eval('Array.from(document.querySelectorAll("#members tr[data-node]"))'
                                 '.map(r => r.getAttribute("data-node") + ":" + r.getAttribute("data-state"))')
            check("0:self" in hosts and "1:alive" in hosts, f"members on the page: {hosts}")
            bars = browser.eval('document.querySelectorAll("#ranks [data-rank]").length')
            check(bars >= 4, f"{bars} rank bars on the page")
            # Rank 3 computes 3x longer: named a straggler after the 5 s window.
            browser.wait_for('!!document.querySelector(\'#ranks [data-rank="3"][data-straggler="true"]\')'
                             ' && document.querySelectorAll(\'#ranks [data-rank][data-score]:not([data-score=""])\').length >= 4',
                             timeout=30)
            score = float(browser.eval('document.querySelector(\'#ranks [data-rank="3"]\').getAttribute("data-score")'))
            check(score < 0.7, f"rank 3's score on the page is {score}")
            browser.screenshot(os.path.join(out, "live_view_healthy.png"))

            victim.kill()
            killed = time.monotonic()

            def verdict():
                try:
                    doc = survivor.status()
                except (OSError, Failure):
                    return None
                return any(e["kind"] == "node_lost" for e in doc["events"])

            wait_until(verdict, 30, "node 0 to declare node 1 lost", poll=0.05)
            verdict_at = time.monotonic()
            shown = browser.wait_for(
                '!!document.querySelector(\'#members tr[data-node="1"][data-state="lost"]\')',
                timeout=10)
            after_verdict = time.monotonic() - verdict_at
            rows = browser.eval('document.querySelectorAll(\'#members tr[data-node="1"]\').length')
            check(rows == 1, f"node 1 is listed {rows} times once lost")
            check(after_verdict <= 2.0,
                  f"the page showed node 1 lost {after_verdict:.2f} s after the verdict")
            banner = browser.eval('document.querySelector("#banner").getAttribute("data-level") + '
                                  '" " + document.querySelector("#banner").textContent')
            check(banner.startswith("error") and "1" in banner, f"banner: {banner}")
            # The group re-formed without node 1: its ranks report again.
            browser.wait_for('document.querySelectorAll(\'#ranks [data-rank][data-score]:not([data-score=""])\').length >= 2',
                             timeout=30)
            rows = browser.eval('document.querySelectorAll(\'#members tr[data-node="1"]\').length')
            check(rows == 1, f"node 1 is listed {rows} times after the re-form")
            browser.screenshot(os.path.join(out, "live_view_node_lost.png"))
            print(f"browser: verdict {verdict_at - killed:.2f} s after the kill; the page showed "
                  f"node 1 lost {after_verdict:.2f} s after the verdict (waited {shown:.2f} s); "
                  f"screenshots in {out}")
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    return 0, ""


def raw_request(port, data, timeout=5.0):
    """Sends bytes, returns what comes back until the server closes or `timeout`."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        reply = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
        except socket.timeout:
            pass
        return reply.decode(errors="replace")


def steps_of(agent):
    return sum(r["steps"] for r in agent.status()["ranks"])


def case_hostile(args):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 4096), hard), hard))
    with Job(nodes=1) as job:
        job.formed()
        agent = job.agents[0]
        port = int(agent.url.rsplit(":", 1)[1].rstrip("/"))
        code, body, _ = http(agent.url + "nope")
        check(code == 404, f"unknown path: {code}")
        code, _, headers = http(agent.url + "metrics", method="POST", data=b"x")
        check(code == 405 and "GET" in headers.get("Allow", ""), f"POST: {code} {headers}")
        reply = raw_request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " +
                            b"a" * 65536 + b"\r\n\r\n")
        check(reply.startswith("HTTP/1.1 431"), f"64 KiB header: {reply[:80]!r}")
        reply = raw_request(port, b"GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n"
                            + b"b" * 4096)
        check(reply.startswith("HTTP/1.1 413"), f"a body: {reply[:80]!r}")
        reply = raw_request(port, b"\x16\x03\x01garbage\r\n\r\n")
        check(reply.startswith("HTTP/1.1 400"), f"garbage: {reply[:80]!r}")

        before = steps_of(agent)
        idle = []
        try:
            for _ in range(1000):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            start = time.monotonic()
            code, text, _ = http(agent.url + "metrics", timeout=5)
            took = time.monotonic() - start
            check(code == 200 and "ddprun_round " in text, f"scrape during the flood: {code}")
            check(took < 1.0, f"a scrape took {took:.2f} s with 1,000 idle connections open")
            time.sleep(1.0)
            during = steps_of(agent)
            check(during > before, f"the workers made no step during the flood ({before} -> {during})")
        finally:
            for s in idle:
                s.close()
        # A client that starts a request and never finishes it is closed by the idle timeout.
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            start = time.monotonic()
            closed = False
            try:
                while s.recv(4096):
                    pass
                closed = True
            except socket.timeout:
                pass
            waited = time.monotonic() - start
            check(closed and waited < 25, f"an unfinished request stayed open {waited:.1f} s")
        code, _, _ = http(agent.url + "readyz")
        check(code == 200, "the agent is not ready after the hostile clients")
        print(f"hostile: 404, 405, 431, 413, 400; a scrape answered in {took * 1000:.0f} ms with "
              f"1,000 idle connections open, workers stepped {before} -> {during}; an unfinished "
              f"request was closed after {waited:.1f} s")
    return 0, ""


def case_token(args):
    token = "t0ken-" + os.urandom(8).hex()
    with Job(nodes=1, status_host="0.0.0.0", env={"DDP_STORE_TOKEN": token}) as job:
        port = int(job.agents[0].url.rsplit(":", 1)[1].rstrip("/"))
        base = f"http://127.0.0.1:{port}/"
        code, body, headers = http(base + "status")
        check(code == 401 and "Bearer" in headers.get("WWW-Authenticate", ""),
              f"no token: {code} {headers}")
        code, _, _ = http(base + "status", headers={"Authorization": "Bearer wrong"})
        check(code == 401, f"wrong token: {code}")
        code, body, _ = http(base + "status", headers={"Authorization": "Bearer " + token})
        check(code == 200 and json.loads(body)["kind"] == "agent", f"Bearer: {code}")
        code, _, _ = http(base + "metrics?token=" + token)
        check(code == 200, f"?token=: {code}")
        check("clients must carry" in job.agents[0].output(), "the log does not say a token is needed")
        print("token: 401 without or with a wrong token, 200 with the Bearer header or ?token=")
    return 0, ""


def case_daemon(args):
    if not shutil.which("promtool"):
        return SKIP, "promtool not installed (scripts/setup installs prometheus)"
    proc = subprocess.Popen([os.path.join(bin_dir(), "ddp-rendezvous"), "--host", "127.0.0.1",
                             "--port", "0", "--status-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines = []
    try:
        store_port = int(proc.stdout.readline())
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            match = URL_LINE.search(line)
            if match:
                url = match.group(1)
        check(url, "the daemon did not log its live view URL:\n" + "".join(lines))
        threading.Thread(target=lambda: [lines.append(l) for l in proc.stderr], daemon=True).start()
        # Three raw connections count as clients while they are open (no hello needed).
        clients = [socket.create_connection(("127.0.0.1", store_port)) for _ in range(3)]
        try:
            code, text, _ = wait_until(
                lambda: (lambda r: r if metric_value(r[1], "ddprun_store_clients") == 3 else None)(
                    http(url + "metrics")), 10, "the daemon to count 3 clients")
            rc, remarks = promtool(text)
            check(rc == 0 and remarks == "", f"promtool on the daemon: rc {rc}: {remarks}")
            check(metric_value(text, "ddprun_store_connections_total") >= 3, "connections_total")
            code, body, _ = http(url + "status")
            doc = json.loads(body)
            check(code == 200 and doc["kind"] == "daemon" and doc["clients"] == 3, f"status {doc}")
            for path in ("livez", "readyz"):
                code, body, _ = http(url + path)
                check(code == 200, f"daemon /{path}: {code} {body}")
            code, page, _ = http(url)
            check(code == 200 and "<html" in page, "the daemon serves no page")
        finally:
            for c in clients:
                c.close()
        print("daemon: promtool passed, 3 clients counted, /status, /livez, /readyz and / answer")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return 0, ""


def case_hang(args):
    # Rank 3 (node 1) blocks before step 5's collective on the first attempt.
    with Job(worker_args=["sleep_before", "3", "5", "--steps", "100000", "--step_ms", "40"],
             hang_timeout=3) as job:
        job.formed()

        def reported(agent):
            try:
                doc = agent.status()
            except (OSError, Failure):
                return None
            ok = (doc["incident"] and doc["incident"]["culprits"] == [3]
                  and doc["restarts"]["by_cause"]["hang"] >= 1
                  and any(e["kind"] == "hang" for e in doc["events"]))
            return doc if ok else None

        for agent in job.agents:
            doc = wait_until(lambda: reported(agent), 60,
                             f"{agent.name} to show the hang:\n{agent.output()}")
            check(doc["incident"]["hang_kind"] == "behind", f"incident {doc['incident']}")
            check("rank 3" in doc["incident"]["summary"], f"incident {doc['incident']}")
            _, text, _ = http(agent.url + "metrics")
            check(metric_value(text, "ddprun_hangs_total") == 1, "ddprun_hangs_total is not 1")
            check(metric_value(text, "ddprun_restarts_total", '{cause="hang"}') >= 1,
                  "no restart counted for the hang")
        # The culprit's node wrote the incident file and names it.
        files = [a.status()["incident"]["file"] for a in job.agents]
        check(any(f.endswith("_node1.json") for f in files), f"incident files {files}")
        print(f"hang: both nodes show the hang of rank 3 (behind), the restart it cost and "
              f"the incident file {files}")
    return 0, ""


CASES = {"hang": case_hang, "metrics": case_metrics, "prometheus": case_prometheus, "browser": case_browser,
         "hostile": case_hostile, "token": case_token, "daemon": case_daemon}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--out", help="keep the screenshots in this directory")
    args = parser.parse_args()
    # ctest's timeout and Ctrl-C: leave through the with-blocks, which stop
    # every process the case started.
    for signo in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signo, lambda s, _f: sys.exit(128 + s))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    try:
        code, why = CASES[args.case](args)
    except Failure as e:
        print(f"{args.case}: FAILED: {e}")
        return 1
    if code == SKIP:
        print(f"{args.case}: skipped: {why}")
    return code


if __name__ == "__main__":
    sys.exit(main())
