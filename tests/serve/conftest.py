"""attn serve as its users meet it: a server started on a free loopback port
with the small random fixtures, driven by the official openai package (pinned
in .venv/serve by scripts/bootstrap --tests) and by plain HTTP (urllib,
http.client, sockets). ctest runs these files (label serve); by hand:

    ATTN_CLI=build/attn .venv/serve/bin/python -m pytest -q tests/serve

Everything stays on 127.0.0.1 and every test bounds its own time.
"""
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
QWEN3 = os.path.join(FIXTURES, "open_models", "qwen3")
GPT2 = os.path.join(FIXTURES, "hf_gpt2", "fp32")


def attn_cli():
    path = os.environ.get("ATTN_CLI", os.path.join(ROOT, "build", "attn"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"no attn binary at {path} (set ATTN_CLI)")
    return path


class Server:
    """One `attn serve` process; its stderr lines are kept in .log."""

    def __init__(self, model, *flags, env=None):
        cmd = [attn_cli(), "serve", "--model", model, "--port", "0", *flags]
        e = dict(os.environ)
        e.setdefault("OMP_NUM_THREADS", "1")
        e.update(env or {})
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     env=e, text=True, errors="replace")
        self.log = []
        self.port = None
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.log.append(line.rstrip("\n"))
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=drain, daemon=True)
        self.reader.start()
        if not ready.wait(30) or self.port is None:
            self.proc.kill()
            raise RuntimeError("attn serve did not start:\n" + "\n".join(self.log))
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.reader.join(5)
        return code


@pytest.fixture(scope="session")
def qwen():
    s = Server(QWEN3, "--parallel", "4", "--model-name", "qwen3-tiny")
    yield s
    assert s.stop() == 0, "\n".join(s.log[-20:])


@pytest.fixture(scope="session")
def gpt2():
    s = Server(GPT2, "--parallel", "2")
    yield s
    assert s.stop() == 0, "\n".join(s.log[-20:])


def request(url, path, body=None, method=None, headers=None, raw=None, timeout=30):
    """(status, headers, parsed JSON or text) of one HTTP request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"Content-Type": "application/json"} if data is not None else {}
    h.update(headers or {})
    req = urllib.request.Request(url + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, text = r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        status, hdrs, text = e.code, dict(e.headers), e.read().decode()
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


def metrics(url):
    _, _, text = request(url, "/metrics")
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def wait_idle(url, timeout=15):
    """Polls /metrics until no slot is busy and nothing waits; returns the metrics."""
    deadline = time.time() + timeout
    while True:
        m = metrics(url)
        if m["attn_slots_busy"] == 0 and m["attn_requests_waiting"] == 0:
            return m
        if time.time() > deadline:
            raise AssertionError(f"still busy after {timeout} s: {m}")
        time.sleep(0.05)
