"""A tiny headless Chromium driver for tests: Python 3 standard library only.

It speaks the DevTools protocol over --remote-debugging-pipe: Chromium reads
NUL-terminated JSON messages from its fd 3 and writes its replies and events to
its fd 4, so no websocket library is needed.

    with Browser() as b:
        b.open("http://127.0.0.1:8080/")
        b.wait_for("document.querySelector('#state').textContent === 'running'", 2)
        print(b.eval("document.title"))
        b.screenshot("/tmp/page.png")

Chromium runs in its own session and process group, with a private temporary
profile. close() (and leaving the with block, whatever the reason) kills the
whole group, reaps the browser and removes the profile. The launcher also asks
the kernel to SIGKILL the browser if the thread that started it dies.
"""

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium",
              "/usr/bin/chromium-browser", "/usr/bin/google-chrome")

# Runs in the child before Chromium: puts the two pipe ends at fds 3 and 4,
# closes everything else above 2, asks for SIGKILL when the parent thread dies,
# then execs Chromium (same pid, so the pid is the process group's leader).
_TRAMPOLINE = r"""
import ctypes, fcntl, os, signal, sys
rd, wr = int(sys.argv[1]), int(sys.argv[2])
hi_rd = fcntl.fcntl(rd, fcntl.F_DUPFD_CLOEXEC, 10)
hi_wr = fcntl.fcntl(wr, fcntl.F_DUPFD_CLOEXEC, 10)
os.dup2(hi_rd, 3, inheritable=True)
os.dup2(hi_wr, 4, inheritable=True)
os.closerange(5, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 4096)
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != int(sys.argv[3]):
    os._exit(111)  # the parent is already gone
os.execv(sys.argv[4], sys.argv[4:])
"""


class BrowserError(RuntimeError):
    pass


def find_chromium():
    env = os.environ.get("DDP_CHROMIUM")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise BrowserError("DDP_CHROMIUM=%s is not an executable file" % env)
        return env
    for path in CANDIDATES:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise BrowserError("no Chromium found (looked for %s; set DDP_CHROMIUM)" % ", ".join(CANDIDATES))


class Browser:
    def __init__(self, width=1280, height=900, timeout=30):
        self.width = int(width)
        self.height = int(height)
        self.timeout = float(timeout)
        self._proc = None
        self._tmp = None
        self._stderr = None
        self._to_fd = None    # we write commands here (Chromium's fd 3)
        self._from_fd = None  # we read replies here (Chromium's fd 4)
        self._buf = b""
        self._next_id = 0
        self._events = []
        self._session = None
        self._target = None
        self.dialogs = []     # messages of JavaScript dialogs (alert, confirm...), dismissed at once
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # ---- life cycle -------------------------------------------------------

    def _start(self):
        exe = find_chromium()
        self._tmp = tempfile.mkdtemp(prefix="ddp-chromium-")
        profile = os.path.join(self._tmp, "profile")
        os.mkdir(profile)
        self._stderr = open(os.path.join(self._tmp, "stderr.log"), "w+b")
        cmd_rd, cmd_wr = os.pipe()    # us -> chromium
        rep_rd, rep_wr = os.pipe()    # chromium -> us
        args = [
            exe,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--user-data-dir=" + profile,
            "--remote-debugging-pipe",
            "--window-size=%d,%d" % (self.width, self.height),
            "--hide-scrollbars",
            "--mute-audio",
            "--no-proxy-server",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-sync",
            "--disable-breakpad",
            "--disable-crash-reporter",
            "--disable-domain-reliability",
            "--disable-client-side-phishing-detection",
            "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication,CertificateTransparencyComponentUpdater",
            "--disable-dev-shm-usage",
            "--disable-pings",
            "--metrics-recording-only",
            "--password-store=basic",
            "--use-mock-keychain",
            "--log-level=3",
            "about:blank",
        ]
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _TRAMPOLINE,
                 str(cmd_rd), str(rep_wr), str(os.getpid())] + args,
                stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr,
                pass_fds=(cmd_rd, rep_wr), start_new_session=True, close_fds=True)
        finally:
            os.close(cmd_rd)
            os.close(rep_wr)
            self._to_fd, self._from_fd = cmd_wr, rep_rd
            if self._proc is None:
                os.close(cmd_wr)
                os.close(rep_rd)
                self._to_fd = self._from_fd = None
        # The first command proves the browser is up.
        self.send("Browser.getVersion", timeout=max(self.timeout, 20.0))

    def close(self):
        """Kills Chromium's whole process group, reaps it, removes the profile. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None and self._to_fd is not None:
                try:  # a polite close first: lets it flush nothing, but avoids crash dialogs
                    self._write({"id": self._new_id(), "method": "Browser.close"})
                    proc.wait(timeout=2)
                except Exception:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            # Children left in the group (renderers, zygote): kill again until none is left.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    break
                time.sleep(0.05)
        for name in ("_to_fd", "_from_fd"):
            fd = getattr(self, name)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, None)
        if self._stderr is not None:
            try:
                self._stderr.close()
            except OSError:
                pass
            self._stderr = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def pid(self):
        return self._proc.pid if self._proc is not None else None

    # ---- protocol ---------------------------------------------------------

    def stderr_tail(self, limit=4000):
        try:
            path = os.path.join(self._tmp, "stderr.log")
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - limit))
                return f.read().decode("utf-8", "replace").strip()
        except Exception:
            return ""

    def _fail(self, message):
        tail = self.stderr_tail()
        state = ""
        if self._proc is not None and self._proc.poll() is not None:
            state = " (chromium exited with status %s)" % self._proc.returncode
        raise BrowserError("%s%s\n--- chromium stderr (tail) ---\n%s" % (message, state, tail or "(empty)"))

    def _new_id(self):
        self._next_id += 1
        return self._next_id

    def _write(self, msg):
        data = json.dumps(msg).encode() + b"\0"
        while data:
            try:
                n = os.write(self._to_fd, data)
            except OSError as e:
                self._fail("cannot write to chromium: %s" % e)
            data = data[n:]

    def _read_message(self, deadline, what):
        """Returns the next message, or raises after the deadline."""
        while True:
            cut = self._buf.find(b"\0")
            if cut >= 0:
                raw, self._buf = self._buf[:cut], self._buf[cut + 1:]
                try:
                    return json.loads(raw.decode("utf-8", "replace"))
                except ValueError:
                    self._fail("chromium sent something that is not JSON: %r" % raw[:200])
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail("timed out waiting for %s" % what)
            ready, _, _ = select.select([self._from_fd], [], [], min(left, 0.5))
            if not ready:
                if self._proc is not None and self._proc.poll() is not None:
                    self._fail("chromium died while waiting for %s" % what)
                continue
            chunk = os.read(self._from_fd, 1 << 20)
            if not chunk:
                if self._proc is not None:
                    try:
                        self._proc.wait(timeout=1)
                    except subprocess.TimeoutExpired:
                        pass
                self._fail("chromium closed its pipe while waiting for %s" % what)
            self._buf += chunk

    def send(self, method, params=None, session=None, timeout=None):
        """Sends one command and returns its result; events met meanwhile are kept."""
        if self._proc is None:
            raise BrowserError("the browser is closed")
        msg_id = self._new_id()
        msg = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self._write(msg)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            reply = self._read_message(deadline, method)
            if reply.get("id") == msg_id:
                if "error" in reply:
                    err = reply["error"]
                    raise BrowserError("%s failed: %s" % (method, err.get("message", err)))
                return reply.get("result", {})
            if "method" in reply:
                self._event(reply)

    def _event(self, msg):
        if msg.get("method") == "Page.javascriptDialogOpening":
            # A dialog blocks the page (and every Runtime.evaluate): dismiss it, keep its text.
            self.dialogs.append(msg.get("params", {}).get("message", ""))
            self._write({"id": self._new_id(), "method": "Page.handleJavaScriptDialog",
                         "params": {"accept": False}, "sessionId": msg.get("sessionId")})
            return
        self._events.append(msg)
        del self._events[:-500]

    def _wait_event(self, method, session, timeout, what):
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self._events):
                if ev.get("method") == method and ev.get("sessionId") == session:
                    del self._events[:i + 1]
                    return ev
            self._events.clear()
            msg = self._read_message(deadline, what)
            if "method" in msg:
                self._event(msg)

    # ---- the API ----------------------------------------------------------

    def open(self, url):
        """Opens url in this browser's page (one tab, reused) and waits for its load event."""
        if self._session is None:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._target = target
            self._session = self.send("Target.attachToTarget",
                                      {"targetId": target, "flatten": True})["sessionId"]
            self.send("Page.enable", session=self._session)
            self.send("Runtime.enable", session=self._session)
            self.send("Emulation.setDeviceMetricsOverride",
                      {"width": self.width, "height": self.height,
                       "deviceScaleFactor": 1, "mobile": False}, session=self._session)
        self._events.clear()
        result = self.send("Page.navigate", {"url": url}, session=self._session)
        if result.get("errorText"):
            raise BrowserError("cannot open %s: %s" % (url, result["errorText"]))
        self._wait_event("Page.loadEventFired", self._session, self.timeout,
                         "the load event of %s" % url)

    def eval(self, js_expression):
        """Evaluates an expression in the page and returns its value (JSON-able values)."""
        if self._session is None:
            raise BrowserError("eval before open()")
        result = self.send("Runtime.evaluate",
                           {"expression": js_expression, "returnByValue": True,
                            "awaitPromise": True}, session=self._session)
        details = result.get("exceptionDetails")
        if details:
            exc = details.get("exception") or {}
            text = exc.get("description") or exc.get("value") or details.get("text") or "exception"
            raise BrowserError("JavaScript error in %r: %s" % (js_expression[:200], text))
        return result.get("result", {}).get("value")

    def wait_for(self, js_predicate, timeout):
        """Polls the predicate every 50 ms until it is truthy; returns the seconds taken."""
        start = time.monotonic()
        last_error = None
        while True:
            try:
                if self.eval("!!(%s)" % js_predicate):
                    return time.monotonic() - start
                last_error = None
            except BrowserError as e:
                if self._proc is None or self._proc.poll() is not None:
                    raise
                last_error = e
            if time.monotonic() - start >= timeout:
                extra = "; last error: %s" % last_error if last_error else ""
                raise BrowserError("timed out after %.1f s waiting for: %s%s"
                                   % (timeout, js_predicate, extra))
            time.sleep(0.05)

    def screenshot(self, path):
        """Writes a PNG of the whole page (beyond the viewport) to path."""
        if self._session is None:
            raise BrowserError("screenshot before open()")
        metrics = self.send("Page.getLayoutMetrics", session=self._session)
        size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
        width = max(1, int(size.get("width", self.width) + 0.999))
        height = max(1, int(size.get("height", self.height) + 0.999))
        result = self.send("Page.captureScreenshot",
                           {"format": "png", "captureBeyondViewport": True,
                            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}},
                           session=self._session)
        data = base64.b64decode(result["data"])
        with open(path, "wb") as f:
            f.write(data)
        return path
