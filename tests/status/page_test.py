#!/usr/bin/python3
"""Tests the live status page (status_http/page/status_page.html) alone, in headless Chromium.

A fake server (Python standard library, 127.0.0.1, a free port) serves the page at
/ and a scripted /status that each case changes while the page is open. One
browser serves every case. One line is printed per case; the exit status is 1
when any case failed, 77 (skipped) when no Chromium is installed.

    /usr/bin/python3 tests/status/page_test.py [--out DIR] [--only NAME] [--page FILE]

--out DIR keeps the screenshots (healthy.png, lost.png, ...) in DIR; without it
they are written to a temporary directory that is removed at the end.
"""

import argparse
import copy
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.parse
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PAGE = os.path.join(REPO, "status_http", "page", "status_page.html")
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree

from browser import Browser, BrowserError, find_chromium  # noqa: E402

SKIP = 77  # ctest's SKIP_RETURN_CODE: no Chromium here

HOSTILE = '<img src=x onerror="window.__pwned=1">'


# ---------------------------------------------------------------------------
# the fake server

class Fake:
    """What /status answers; the test changes it while the page runs."""

    def __init__(self):
        self.lock = threading.Lock()
        self.status = {}
        self.token = None          # when set, /status wants "Authorization: Bearer <token>"
        self.mode = "ok"           # "ok" | "hang" (never answers) | "drop" (closes the connection)
        self.requests = []         # (path, authorization header or None, answer code)

    def set(self, status=None, **kw):
        with self.lock:
            if status is not None:
                self.status = copy.deepcopy(status)
            for k, v in kw.items():
                setattr(self, k, v)

    def get(self):
        with self.lock:
            return copy.deepcopy(self.status), self.token, self.mode

    def log(self, path, auth, code):
        with self.lock:
            self.requests.append((path, auth, code))

    def mark(self):
        with self.lock:
            return len(self.requests)

    def since(self, mark):
        with self.lock:
            return list(self.requests[mark:])


def make_handler(fake, page_bytes):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, code, body, ctype):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the page navigated away meanwhile

        def do_GET(self):
            path = urllib.parse.urlsplit(self.path).path
            auth = self.headers.get("Authorization")
            if path == "/":
                self.fake_log(path, auth, 200)
                self._send(200, page_bytes, "text/html; charset=utf-8")
                return
            if path != "/status":
                self.fake_log(path, auth, 404)
                self._send(404, b"not found\n", "text/plain")
                return
            status, token, mode = fake.get()
            if mode == "hang":
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and fake.get()[2] == "hang":
                    time.sleep(0.05)
                self.fake_log(path, auth, 0)
                self.close_connection = True
                return
            if mode == "drop":
                self.fake_log(path, auth, 0)
                self.close_connection = True
                return
            if token is not None and auth != "Bearer " + token:
                self.fake_log(path, auth, 401)
                self._send(401, b'{"error":"unauthorized"}', "application/json")
                return
            self.fake_log(path, auth, 200)
            self._send(200, json.dumps(status).encode(), "application/json")

        def fake_log(self, path, auth, code):
            fake.log(path, auth, code)

    return Handler


# ---------------------------------------------------------------------------
# scripted statuses

def iso(delta_s=0.0):
    t = datetime.now(timezone.utc) - timedelta(seconds=delta_s)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def healthy():
    return {
        "kind": "agent", "run_id": "job42", "backend": "c10d", "time": iso(), "uptime_s": 75.3,
        "node": {"host": "vm", "addr": "10.0.0.1", "group_rank": 0, "pid": 123},
        "nnodes": {"min": 1, "max": 2}, "nproc_per_node": 2,
        "state": "running", "ready": True, "ready_reason": "",
        "round": {"number": 3, "attempt": 4, "world_size": 4, "group_world_size": 2, "formed_s_ago": 25.2},
        "restarts": {"spent": 1, "max": 3,
                     "by_cause": {"worker_failure": 1, "hang": 0, "node_lost": 0, "node_joined": 0}},
        "members": [
            {"node": 0, "host": "vm", "addr": "10.0.0.1", "ranks": [0, 1], "state": "self",
             "last_heard_s": 0.0, "keep_alive_age_s": None, "lost_after_s": None},
            {"node": 1, "host": "vm2", "addr": "10.0.0.2", "ranks": [2, 3], "state": "alive",
             "last_heard_s": 0.4, "keep_alive_age_s": 0.8, "lost_after_s": 15.0},
        ],
        "ranks": [
            {"rank": r, "local_rank": r % 2, "node": r // 2, "host": "vm" if r < 2 else "vm2",
             "pid": 321 + r, "state": "running", "steps": 120 + r, "step_time_s": 0.05 + 0.002 * r,
             "compute_s": 0.04 + 0.001 * r, "straggler_score": [1.0, 0.98, 0.96, 0.99][r],
             "last_progress_s": 0.1, "where": "in allreduce #%d of group 'default' for 0.1 s" % (241 + r),
             "stale": False}
            for r in range(4)
        ],
        "events": [
            {"time": iso(60), "age_s": 60.0, "round": 2, "kind": "round_formed",
             "text": "round 2 formed: 2 nodes, world size 4"},
            {"time": iso(31), "age_s": 31.0, "round": 2, "kind": "worker_failed",
             "text": "rank 1 on node 0 (vm) exited with code 3"},
            {"time": iso(30), "age_s": 30.0, "round": 2, "kind": "restart",
             "text": "restart 1 of 3: worker failure"},
            {"time": iso(25.2), "age_s": 25.2, "round": 3, "kind": "round_formed",
             "text": "round 3 formed: 2 nodes, world size 4"},
        ],
        "incident": None,
    }


def daemon():
    return {"kind": "daemon", "time": iso(), "uptime_s": 3725.0, "address": "0.0.0.0:29400",
            "state": "serving", "ready": True, "auth": True, "clients": 3, "max_clients": 65536,
            "keys": 10, "stored_bytes": 1234, "max_store_bytes": 1073741824,
            "operations": {"set": 10, "get": 5, "wait": 2}}


# ---------------------------------------------------------------------------
# the cases

class Failure(AssertionError):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


def js(s):
    return json.dumps(s)


def q(sel):
    return "document.querySelector(%s)" % js(sel)


def text(b, sel):
    return b.eval("(function(e){return e ? e.textContent : null})(%s)" % q(sel))


def attr(b, sel, name):
    return b.eval("(function(e){return e ? e.getAttribute(%s) : null})(%s)" % (js(name), q(sel)))


def visible(b, sel):
    return b.eval("(function(e){return !!e && !e.hidden && getComputedStyle(e).display !== 'none'"
                  " && e.getBoundingClientRect().height > 0})(%s)" % q(sel))


class Ctx:
    def __init__(self, browser, fake, base, out):
        self.b, self.fake, self.base, self.out = browser, fake, base, out

    def open_with(self, status, ready_js, path="/"):
        self.fake.set(status, mode="ok")
        self.b.open(self.base + path)
        self.b.wait_for(ready_js, 10)


def case_self_contained(ctx):
    with open(PAGE, encoding="utf-8") as f:
        html = f.read()
    check(')ddp_page"' not in html, 'the page holds )ddp_page" and would end the C++ raw string')
    check(not re.search(r"<script[^>]*\bsrc\s*=", html, re.I), "a <script src=...>: the page must be self-contained")
    check(not re.search(r"<link[^>]*stylesheet", html, re.I), "an external stylesheet")
    css = " ".join(re.findall(r"<style[^>]*>(.*?)</style>", html, re.S | re.I))
    check(css and not re.search(r"@import|url\s*\(", css, re.I), "a CSS @import or url(): nothing may be fetched")
    check(not re.search(r"(src|href|action)\s*=\s*[\"']?(https?:)?//", html, re.I), "a reference to another host")
    check(not re.search(r"https?://", html, re.I), "an http(s):// address in the page")
    return "%d bytes, no external reference" % len(html.encode())


def case_healthy(ctx):
    b = ctx.b
    mark = ctx.fake.mark()
    ctx.open_with(healthy(), "document.querySelectorAll('#ranks [data-rank]').length === 4")
    check(text(b, "#state") == "running", "#state is %r, not running" % text(b, "#state"))
    check(text(b, "#round") == "3", "#round is %r, not 3" % text(b, "#round"))
    check(attr(b, '#members tr[data-node="0"]', "data-state") == "self", "node 0 is not 'self'")
    check(attr(b, '#members tr[data-node="1"]', "data-state") == "alive", "node 1 is not 'alive'")
    row0, row1 = text(b, '#members tr[data-node="0"]'), text(b, '#members tr[data-node="1"]')
    check("vm" in row0 and "10.0.0.1" in row0, "node 0's row lacks its host/address: %r" % row0)
    check("vm2" in row1 and "10.0.0.2" in row1, "node 1's row lacks its host/address: %r" % row1)
    check(b.eval("document.querySelectorAll('#members tbody tr').length") == 2, "not exactly 2 member rows")
    scores = b.eval("Array.from(document.querySelectorAll('#ranks [data-rank]')).map(e => [e.dataset.rank, e.dataset.score, e.dataset.straggler])")
    check([s[0] for s in scores] == ["0", "1", "2", "3"], "ranks shown: %r" % scores)
    check([float(s[1]) for s in scores] == [1.0, 0.98, 0.96, 0.99], "scores: %r" % scores)
    check(all(s[2] == "false" for s in scores), "a healthy rank is marked as a straggler: %r" % scores)
    check(text(b, '#ranks [data-rank="2"] .sval') == "0.96", "rank 2's score text: %r" % text(b, '#ranks [data-rank="2"] .sval'))
    check(attr(b, "#banner", "data-level") == "ok", "banner level %r, not ok" % attr(b, "#banner", "data-level"))
    check("healthy" in text(b, "#banner").lower(), "banner does not say healthy: %r" % text(b, "#banner"))
    check(not visible(b, "#conn"), "#conn is visible while the server answers")
    check(not visible(b, "#daemon"), "the daemon view is visible for an agent")
    check(text(b, "#incident").strip() == "none", "#incident is not 'none': %r" % text(b, "#incident"))
    check(b.eval("document.querySelectorAll('#events li[data-kind=\"round_formed\"]').length") == 2, "round_formed events missing")
    kinds = b.eval("Array.from(document.querySelectorAll('#events li')).map(e => e.dataset.kind)")
    check(kinds == ["round_formed", "restart", "worker_failed", "round_formed"], "events are not newest first: %r" % kinds)
    check(b.eval("document.querySelectorAll('#timeline [data-kind]').length") == 4, "the timeline strip lacks markers")
    check("1 / 3" in text(b, "#restarts"), "restarts: %r" % text(b, "#restarts"))
    b.eval("new Promise(r => setTimeout(r, 1100))")  # a few polls
    paths = {p for p, _, _ in ctx.fake.since(mark)}
    check(paths <= {"/", "/status"}, "the page asked for something else: %r" % sorted(paths))
    n_status = sum(1 for p, _, _ in ctx.fake.since(mark) if p == "/status")
    check(n_status >= 2, "the page polled /status only %d times in over a second" % n_status)
    b.screenshot(os.path.join(ctx.out, "healthy.png"))
    return "%d polls of /status in about 1.3 s" % n_status


def case_keepalive_near(ctx):
    b = ctx.b
    ctx.open_with(healthy(), "document.querySelectorAll('#ranks [data-rank]').length === 4")
    s = healthy()
    s["members"][1].update(last_heard_s=12.0, keep_alive_age_s=12.0)
    ctx.fake.set(s)
    took = b.wait_for("%s.getAttribute('data-level') === 'warn'" % q("#banner"), 1.5)
    fill = float(attr(b, '#members tr[data-node="1"] .bar', "data-fill"))
    check(0.79 < fill < 0.81, "keep-alive bar fill %r, not 0.8" % fill)
    check("node 1" in text(b, "#banner").lower(), "the warning does not name node 1: %r" % text(b, "#banner"))
    return "warning after %.2f s" % took


def case_lost(ctx):
    b = ctx.b
    ctx.open_with(healthy(), "document.querySelectorAll('#ranks [data-rank]').length === 4")
    check(attr(b, "#banner", "data-level") == "ok", "not healthy before the flip")
    s = healthy()
    s["members"][1].update(state="lost", last_heard_s=16.1, keep_alive_age_s=16.1)
    for r in s["ranks"][2:]:
        r["stale"] = True
    s["events"].append({"time": iso(), "age_s": 0.0, "round": 3, "kind": "node_lost",
                        "text": "node 1 (vm2) lost: no keep-alive for 15.0 s"})
    ctx.fake.set(s)
    took = b.wait_for("(function(){var r=%s, b=%s; return r && r.getAttribute('data-state')==='lost'"
                      " && b.getAttribute('data-level')==='error'})()"
                      % (q('#members tr[data-node="1"]'), q("#banner")), 1.5)
    banner = text(b, "#banner")
    check("node 1" in banner.lower() and "vm2" in banner, "banner does not name node 1 (vm2): %r" % banner)
    check(b.eval("document.querySelectorAll('#events li[data-kind=\"node_lost\"]').length") == 1, "no node_lost event")
    check(attr(b, "#events li", "data-kind") == "node_lost", "the newest event is not first")
    check(attr(b, '#members tr[data-node="0"]', "data-state") == "self", "node 0 changed")
    bg = b.eval("getComputedStyle(%s).backgroundColor" % q('#members tr[data-node="1"] td'))
    bg0 = b.eval("getComputedStyle(%s).backgroundColor" % q('#members tr[data-node="0"] td'))
    check(bg != bg0, "the lost node's row is not coloured (%s)" % bg)
    b.screenshot(os.path.join(ctx.out, "lost.png"))
    return "shown %.2f s after the flip" % took


def case_hang(ctx):
    b = ctx.b
    ctx.open_with(healthy(), "document.querySelectorAll('#ranks [data-rank]').length === 4")
    s = healthy()
    summary = "rank 3 never reached allreduce #11 of group 'default', which ranks 0, 1, 2 have waited in for 3.0 s"
    s["incident"] = {"kind": "hang", "hang_kind": "behind", "summary": summary, "culprits": [3], "node": 1,
                     "time": iso(), "file": "/logs/job42/attempt_4/hang_0_node1.json"}
    s["events"].append({"time": iso(), "age_s": 0.0, "round": 3, "kind": "hang", "text": "hang (behind): " + summary})
    s["ranks"][3]["where"] = "not in a collective: its last, allreduce #10, completed 3.0 s ago"
    ctx.fake.set(s)
    took = b.wait_for("%s.textContent.includes('never reached allreduce #11')" % q("#incident"), 1.5)
    inc = text(b, "#incident")
    check(summary in inc, "the incident box lacks the summary: %r" % inc)
    check("rank 3" in text(b, "#incident-culprits"), "culprits: %r" % text(b, "#incident-culprits"))
    check("hang_0_node1.json" in text(b, "#incident-file"), "no incident file path")
    check("behind" in inc and "node 1" in inc, "the incident lacks its kind or node: %r" % inc)
    check(attr(b, '#ranks [data-rank="3"]', "data-culprit") == "true", "rank 3 is not marked as the culprit")
    check(b.eval("%s.classList.contains('culprit')" % q('#ranks [data-rank="3"]')), "rank 3 is not highlighted")
    check(b.eval("document.querySelectorAll('#ranks [data-culprit=\"true\"]').length") == 1, "more than one culprit marked")
    check(attr(b, "#banner", "data-level") == "error", "banner level is not error")
    banner = text(b, "#banner")
    check("rank 3" in banner and "node 1" in banner, "banner does not name rank 3 on node 1: %r" % banner)
    check(b.eval("document.querySelectorAll('#events li[data-kind=\"hang\"]').length") == 1, "no hang event")
    b.screenshot(os.path.join(ctx.out, "hang.png"))
    # After a restart into a new round, the incident is kept but is no longer red.
    s2 = copy.deepcopy(s)
    s2["round"].update(number=4, formed_s_ago=1.0)
    s2["events"].append({"time": iso(), "age_s": 0.0, "round": 4, "kind": "round_formed", "text": "round 4 formed"})
    ctx.fake.set(s2)
    b.wait_for("%s.textContent === '4'" % q("#round"), 1.5)
    check(attr(b, "#banner", "data-level") == "warn", "an old round's hang still makes the banner %r" % attr(b, "#banner", "data-level"))
    return "incident shown %.2f s after it appeared" % took


def case_straggler(ctx):
    b = ctx.b
    ctx.open_with(healthy(), "document.querySelectorAll('#ranks [data-rank]').length === 4")
    s = healthy()
    s["ranks"][2].update(straggler_score=0.4, step_time_s=0.125, compute_s=0.1)
    s["events"].append({"time": iso(), "age_s": 0.0, "round": 3, "kind": "straggler",
                        "text": "straggler: rank 2 (node 1, host vm2) has scored below 0.7 for 5 s"})
    ctx.fake.set(s)
    took = b.wait_for("%s.getAttribute('data-straggler') === 'true'" % q('#ranks [data-rank="2"]'), 1.5)
    check(attr(b, '#ranks [data-rank="2"]', "data-score") == "0.4", "data-score of rank 2: %r" % attr(b, '#ranks [data-rank="2"]', "data-score"))
    check(b.eval("%s.classList.contains('straggler')" % q('#ranks [data-rank="2"]')), "rank 2 lacks the straggler class")
    flagged = b.eval("Array.from(document.querySelectorAll('#ranks [data-straggler=\"true\"]')).map(e => e.dataset.rank)")
    check(flagged == ["2"], "stragglers marked: %r" % flagged)
    c2 = b.eval("getComputedStyle(%s).backgroundColor" % q('#ranks [data-rank="2"] .score > span'))
    c0 = b.eval("getComputedStyle(%s).backgroundColor" % q('#ranks [data-rank="0"] .score > span'))
    check(c2 != c0, "the straggler's score bar has the same colour as the fastest rank's (%s)" % c2)
    check(attr(b, "#banner", "data-level") == "warn", "banner is not a warning")
    check("rank 2" in text(b, "#banner").lower(), "banner does not name rank 2: %r" % text(b, "#banner"))
    check(b.eval("document.querySelectorAll('#events li[data-kind=\"straggler\"]').length") == 1, "no straggler event")
    return "marked %.2f s after it appeared" % took


def case_hostile(ctx):
    b = ctx.b
    s = healthy()
    s["run_id"] = "<script>window.__pwned=2</script>"
    s["node"]["host"] = HOSTILE
    s["members"][1].update(host=HOSTILE, addr='"><svg onload="window.__pwned=3">', state="lost")
    s["members"][0]["host"] = "<b id=injected>bold</b>"
    s["ranks"][3]["host"] = HOSTILE
    s["ranks"][3]["where"] = "<iframe src=javascript:window.__pwned=4>"
    s["events"].append({"time": "<i id=injected2>not a time</i>", "age_s": 1, "round": "<u id=injected3>", "kind": "<img src=x onerror=alert(1)>",
                        "text": HOSTILE})
    s["incident"] = {"kind": "hang", "hang_kind": "<b>x</b>", "summary": HOSTILE, "culprits": [3], "node": 1,
                     "time": iso(), "file": "<a href=javascript:alert(1)>f</a>"}
    s["restarts"]["by_cause"] = {"<img src=x onerror=alert(1)>": 1}
    s["ready_reason"] = HOSTILE
    dialogs = len(b.dialogs)
    ctx.open_with(s, "%s !== null" % q('#members tr[data-node="1"]'))
    b.eval("new Promise(r => setTimeout(r, 700))")  # let a few renders and any image error happen
    counts = b.eval("({img: document.querySelectorAll('img').length, svg: document.querySelectorAll('svg').length,"
                    " iframe: document.querySelectorAll('iframe').length, a: document.querySelectorAll('a').length,"
                    " b: document.querySelectorAll('#injected, #injected2, #injected3').length,"
                    " script: document.querySelectorAll('script').length, pwned: typeof window.__pwned})")
    check(len(b.dialogs) == dialogs, "a hostile string opened a dialog: %r" % b.dialogs[dialogs:])
    check(counts == {"img": 0, "svg": 0, "iframe": 0, "a": 0, "b": 0, "script": 1, "pwned": "undefined"},
          "hostile strings made elements or ran: %r" % counts)
    host = text(b, '#members tr[data-node="1"] td.hostcell')
    check(host == HOSTILE, "node 1's host is not shown as text: %r" % host)
    check(HOSTILE in text(b, "#banner"), "the banner does not show the host name as text")
    check(HOSTILE in text(b, "#incident-summary"), "the incident summary is not shown as text")
    check("<script>" in text(b, "#title"), "the run id is not shown as text")
    check("<img src=x onerror=alert(1)>" in b.eval("document.querySelector('#events').textContent"), "the event kind is not text")
    return "no element created, nothing ran"


def case_daemon(ctx):
    b = ctx.b
    took_ready = "(function(){var d=%s; return d && !d.hidden})()" % q("#daemon")
    ctx.open_with(daemon(), took_ready)
    check(not visible(b, "#job"), "the job sections are visible in the daemon view")
    check(not visible(b, "#round"), "#round is visible in the daemon view")
    check(text(b, "#d-address") == "0.0.0.0:29400", "address: %r" % text(b, "#d-address"))
    check(text(b, "#d-clients") == "3" and "65,536" in text(b, "#d-clients-sub"), "clients: %r / %r" % (text(b, "#d-clients"), text(b, "#d-clients-sub")))
    check(text(b, "#d-keys") == "10", "keys: %r" % text(b, "#d-keys"))
    check("1.21 KiB" in text(b, "#d-stored") and "1.00 GiB" in text(b, "#d-stored-sub"), "stored: %r %r" % (text(b, "#d-stored"), text(b, "#d-stored-sub")))
    check(text(b, "#d-auth").startswith("on"), "auth: %r" % text(b, "#d-auth"))
    check("1 h" in text(b, "#d-uptime"), "uptime: %r" % text(b, "#d-uptime"))
    ops = b.eval("Array.from(document.querySelectorAll('#ops tbody tr')).map(e => [e.dataset.op, e.cells[1].textContent])")
    check(ops == [["set", "10"], ["get", "5"], ["wait", "2"]], "operations: %r" % ops)
    check(text(b, "#state") == "serving", "#state: %r" % text(b, "#state"))
    check(attr(b, "#banner", "data-level") == "ok", "banner level: %r" % attr(b, "#banner", "data-level"))
    check("0.0.0.0:29400" in text(b, "#banner"), "banner: %r" % text(b, "#banner"))
    b.screenshot(os.path.join(ctx.out, "daemon.png"))
    # then the store fills up: a warning
    d = daemon()
    d["stored_bytes"] = 1000000000
    ctx.fake.set(d)
    b.wait_for("%s.getAttribute('data-level') === 'warn'" % q("#banner"), 1.5)
    return "address, clients, keys, bytes, operations, auth, uptime"


def case_connection_lost(ctx):
    b = ctx.b
    ctx.open_with(healthy(), "document.querySelectorAll('#ranks [data-rank]').length === 4")
    check(not visible(b, "#conn"), "#conn is visible before the server stops")
    ctx.fake.set(mode="hang")
    took_hang = b.wait_for("(function(){var c=%s; return !c.hidden && c.getBoundingClientRect().height > 0})()" % q("#conn"), 2.0)
    check("retrying" in text(b, "#conn").lower(), "#conn does not say it retries: %r" % text(b, "#conn"))
    check(b.eval("document.body.classList.contains('stale')"), "the old data is not greyed")
    check(text(b, "#state") == "running" and b.eval("document.querySelectorAll('#ranks [data-rank]').length") == 4,
          "the last data is not kept")
    ctx.fake.set(mode="ok")
    took_back = b.wait_for("%s.hidden" % q("#conn"), 3.0)
    check(not b.eval("document.body.classList.contains('stale')"), "still greyed after recovery")
    ctx.fake.set(mode="drop")
    took_drop = b.wait_for("!%s.hidden" % q("#conn"), 2.0)
    ctx.fake.set(mode="ok")
    b.wait_for("%s.hidden" % q("#conn"), 3.0)
    return "unanswered: banner after %.2f s; recovered in %.2f s; dropped: banner after %.2f s" % (took_hang, took_back, took_drop)


def case_sparse(ctx):
    b = ctx.b
    s = {"kind": "agent", "state": "rendezvous", "ready": False, "ready_reason": "waiting for 1 more node",
         "round": None, "restarts": {"spent": None}, "node": None,
         "members": [None, {"node": 0}, {"node": 1, "state": "alive", "keep_alive_age_s": "x", "lost_after_s": 0}],
         "ranks": [{"rank": 0}, {"rank": 1, "straggler_score": None, "step_time_s": None}, "junk"],
         "events": [{}, {"kind": "restart", "age_s": None, "time": "not a time"}], "incident": None}
    ctx.open_with(s, "%s.textContent === 'rendezvous'" % q("#state"))
    b.eval("new Promise(r => setTimeout(r, 600))")
    check(b.eval("document.getElementById('renderr').hidden"), "a sparse status broke rendering: %r" % text(b, "#renderr"))
    check(attr(b, "#banner", "data-level") == "warn", "banner for a round being formed: %r" % attr(b, "#banner", "data-level"))
    check("waiting for 1 more node" in text(b, "#banner"), "the banner lacks the reason: %r" % text(b, "#banner"))
    check(b.eval("document.querySelectorAll('#members tbody tr').length") == 2, "members with missing fields are not listed (or null is)")
    check(attr(b, '#ranks [data-rank="1"]', "data-score") == "", "a missing score is not empty")
    # and an empty object, then a failed job
    ctx.fake.set({})
    b.eval("new Promise(r => setTimeout(r, 700))")
    check(b.eval("document.getElementById('renderr').hidden"), "an empty status broke rendering: %r" % text(b, "#renderr"))
    f = healthy()
    f["state"] = "failed"
    f["events"].append({"time": iso(), "age_s": 0.0, "round": 3, "kind": "worker_failed",
                        "text": "rank 2 on node 1 (vm2) exited with code 1"})
    ctx.fake.set(f)
    b.wait_for("%s.getAttribute('data-level') === 'error'" % q("#banner"), 1.5)
    banner = text(b, "#banner")
    check("failed" in banner.lower() and "rank 2 on node 1" in banner, "a failed job's banner: %r" % banner)
    check(b.eval("document.querySelectorAll('#events li[data-kind=\"worker_failed\"]').length") == 2, "worker_failed events")
    return "missing and null fields tolerated; failed job named"


def case_token(ctx):
    b = ctx.b
    token = "s3cr3t/+=&x y"
    s = healthy()
    s["run_id"] = "job-with-token"
    ctx.fake.set(s, token=token, mode="ok")
    mark = ctx.fake.mark()
    b.open(ctx.base + "/?view=1&token=" + urllib.parse.quote(token, safe="") + "#top")
    b.wait_for("%s.textContent === 'job-with-token'" % q("#run"), 10)
    b.eval("new Promise(r => setTimeout(r, 800))")  # a few more polls
    href = b.eval("location.href")
    check("token" not in href and "s3cr3t" not in href, "the token is still in the address bar: %r" % href)
    check("view=1" in href and href.endswith("#top"), "other parts of the address were lost: %r" % href)
    reqs = [r for r in ctx.fake.since(mark) if r[0] == "/status"]
    check(reqs and all(a == "Bearer " + token and c == 200 for _, a, c in reqs),
          "a /status request without the bearer token: %r" % [(a, c) for _, a, c in reqs])
    check(not visible(b, "#conn"), "#conn is visible with a good token")
    # A wrong token: the page says it is not authorised.
    ctx.fake.set(token="another")
    b.wait_for("!%s.hidden && %s.textContent.includes('401')" % (q("#conn"), q("#conn")), 2.5)
    ctx.fake.set(token=None)
    b.eval("sessionStorage.clear()")
    return "%d authorised polls; address bar %s" % (len(reqs), urllib.parse.urlsplit(href)._replace(netloc="...").geturl())


CASES = [
    ("self-contained", case_self_contained),
    ("healthy", case_healthy),
    ("keep-alive-near-lost", case_keepalive_near),
    ("node-lost", case_lost),
    ("hang-incident", case_hang),
    ("straggler", case_straggler),
    ("hostile-strings", case_hostile),
    ("daemon-view", case_daemon),
    ("sparse-and-failed", case_sparse),
    ("connection-lost", case_connection_lost),
    ("token", case_token),
]


# ---------------------------------------------------------------------------

def main():
    global PAGE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="keep the screenshots in this directory")
    ap.add_argument("--only", help="run only the cases whose name contains this")
    ap.add_argument("--page", default=PAGE, help="the page to serve (default: %(default)s)")
    args = ap.parse_args()
    PAGE = os.path.abspath(args.page)

    def on_signal(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    def on_alarm(signum, frame):
        raise TimeoutError("page_test.py ran for more than 170 s")
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(170)

    try:
        find_chromium()
    except BrowserError as e:
        print("skipped: %s (scripts/setup installs chromium)" % e)
        return SKIP

    started = time.monotonic()
    out_tmp = None
    if args.out:
        out = os.path.abspath(args.out)
        os.makedirs(out, exist_ok=True)
    else:
        out = out_tmp = tempfile.mkdtemp(prefix="ddp-page-test-")

    with open(PAGE, "rb") as f:
        page_bytes = f.read()
    fake = Fake()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(fake, page_bytes))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    base = "http://127.0.0.1:%d" % server.server_address[1]

    failures = 0
    try:
        t0 = time.monotonic()
        with Browser(width=1280, height=900, timeout=20) as browser:
            print("chromium started in %.1f s (pid %d); page served at %s" % (time.monotonic() - t0, browser.pid, base))
            ctx = Ctx(browser, fake, base, out)
            for name, fn in CASES:
                if args.only and args.only not in name:
                    continue
                t = time.monotonic()
                try:
                    detail = fn(ctx) or ""
                    print("ok    %-22s %5.2f s  %s" % (name, time.monotonic() - t, detail), flush=True)
                except (Failure, BrowserError) as e:
                    failures += 1
                    print("FAIL  %-22s %5.2f s  %s" % (name, time.monotonic() - t, e), flush=True)
                    try:
                        browser.screenshot(os.path.join(out, "failed-%s.png" % name))
                    except Exception:
                        pass
                finally:
                    fake.set(mode="ok", token=None)
    except BrowserError as e:
        failures += 1
        print("FAIL  browser: %s" % e, flush=True)
    finally:
        fake.set(mode="ok")
        server.shutdown()
        server.server_close()
        if args.out:
            shots = sorted(n for n in os.listdir(out) if n.endswith(".png"))
            print("screenshots in %s: %s" % (out, ", ".join(shots)))
        if out_tmp:
            shutil.rmtree(out_tmp, ignore_errors=True)
        signal.alarm(0)

    total = time.monotonic() - started
    print("%s: %d case(s) failed, %.1f s" % ("FAILED" if failures else "PASSED", failures, total))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
