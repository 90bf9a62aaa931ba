"""Serving and showing runs without blocking or leaking: the monitor over a big log, the report's provenance lines,
the rehearsal's and the stand-in server's ports and run-folder lock. Real files, servers and processes throughout."""
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _env():
    env = dict(os.environ)
    env.pop("ADMIN_API_KEY", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _get(port, path, timeout=60):
    "(status, body, seconds) of one GET on a fresh connection."
    t = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read(), time.monotonic() - t
    finally:
        c.close()


# ---------------------------------------------------------------- the monitor over a big log
N_STEPS, PAD = 15_000, 8_000  # ~120 MB: each line 50 metrics and a long text field (skipped, counted once per line)


@pytest.fixture
def big_log(tmp_path):
    d = tmp_path / "runs" / "mini" / "sao" / "seed0"
    d.mkdir(parents=True)
    keys = ", ".join(f'"extra/k{i}": {i / 50}' for i in range(50))
    pad = "x" * PAD
    with open(d / "metrics.jsonl", "w") as f:
        for s in range(N_STEPS):
            f.write(f'{{"step": {s}, "acc": {s % 7 / 7}, {keys}, "note": "{pad}"}}\n')
    assert (d / "metrics.jsonl").stat().st_size > 100e6
    small = tmp_path / "runs" / "mini" / "grpo" / "seed0"
    small.mkdir(parents=True)
    (small / "metrics.jsonl").write_text('{"step": 1, "acc": 0.5}\n')
    return tmp_path / "runs"


@pytest.fixture
def monitor(big_log):
    "`sao-repro monitor` over the big log in its own process; yields its port."
    p = subprocess.Popen([sys.executable, "-m", "sao_repro.cli", "monitor", "--logs", str(big_log), "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        line = p.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line + p.stderr.read()
        yield int(m.group(1))
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_monitor_loads_a_big_log_in_bounded_parts_and_answers_meanwhile(monitor):
    port = monitor
    status, body, secs = _get(port, "/api/runs")
    runs = {r["run"]: r for r in json.loads(body)}
    big = runs["mini/sao/seed0"]
    assert status == 200 and big["loading"] and 0 < big["loaded_bytes"] < 20e6 < big["total_bytes"]
    assert not runs["mini/grpo/seed0"]["loading"] and runs["mini/grpo/seed0"]["last_step"] == 1

    done = threading.Event()
    first = []
    def load():  # what the page does: poll until the run is loaded
        while not done.is_set():
            first.append(json.loads(_get(port, "/api/runs", timeout=120)[1]))
            if not any(r["loading"] for r in first[-1]):
                done.set()
    t = threading.Thread(target=load, daemon=True)
    t.start()
    answered = 0
    while not done.is_set():  # other requests, while the loader keeps reading
        for path in ("/api/runs", "/", "/api/metrics?run=mini/grpo/seed0"):
            status, _, secs = _get(port, path)
            if not done.is_set():
                assert status == 200 and secs < 5, (path, secs)
                answered += 1
        time.sleep(0.2)
    t.join(timeout=300)
    assert answered >= 3 and len(first) >= 5  # a 120 MB log: several bounded reads, requests answered in between
    info = {r["run"]: r for r in json.loads(_get(port, "/api/runs")[1])}["mini/sao/seed0"]
    assert not info["loading"] and info["loaded_bytes"] == info["total_bytes"]
    assert info["n_steps"] == N_STEPS and info["skipped"]["non_numeric"] == N_STEPS  # every line read exactly once
    m = json.loads(_get(port, "/api/metrics?run=mini/sao/seed0&metrics=acc&max_points=100000")[1])
    assert m["metrics"]["acc"]["step"] == list(range(N_STEPS))
