"""sao_repro.monitor: the JSON API, live updates, the CLI and the security rules, idle connections, a big log read in
bounded parts."""

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

from sao_repro.monitor import CSS, JS, KEY_ENV, monitor_main, make_server, render_page, serve_in_thread
from run_tools import _env, _get

REPO = Path(__file__).resolve().parent.parent
KEY = "k3y-for-tests-0123456789abcdef"


def write_run(root, setting="sao", seed=0, steps=3, extra=b""):
    d = Path(root) / "mini" / setting / f"seed{seed}"
    d.mkdir(parents=True, exist_ok=True)
    lines = b"".join(
        (json.dumps({"step": i, "acc": i / 10, "reward/mean": i / 10, "dis/kept_frac": 0.9}) + "\n").encode()
        for i in range(1, steps + 1)
    )
    (d / "metrics.jsonl").write_bytes(lines + extra)
    (d / "events.log").write_text("2026-11-29T16:00:00\tstart\t{}\n")
    return d


def request(srv, path, method="GET", headers=None, host=None):
    """Raw request (http.client sends the path as given: no `..` normalization)."""
    h, port = srv.server_address[:2]
    c = http.client.HTTPConnection("127.0.0.1" if h in ("0.0.0.0", "127.0.0.1") else h, port, timeout=10)
    hdrs = dict(headers or {})
    if host is not None:
        hdrs["Host"] = host
    c.request(method, path, headers=hdrs, body=b"" if method == "POST" else None)
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body, dict(r.getheaders())


def strict_json(body):
    def bad(c):
        raise ValueError(f"non-standard JSON constant {c}")

    return json.loads(body, parse_constant=bad)


@pytest.fixture
def logs(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "sao", 0, extra=b'{"step": 4, "acc": NaN}\n{"step": 5, "ac')
    write_run(root, "grpo", 1)
    return root


@pytest.fixture
def server(logs, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    srv = serve_in_thread(logs, port=0, refresh_s=0.0)
    yield srv
    srv.shutdown()
    srv.server_close()


# ---------------------------------------------------------------- API


def test_api_runs(server):
    code, body, headers = request(server, "/api/runs")
    assert code == 200 and headers["Content-Type"].startswith("application/json")
    runs = strict_json(body)
    assert isinstance(runs, list) and [r["run"] for r in runs] == ["mini/grpo/seed1", "mini/sao/seed0"]
    sao = runs[1]
    assert sao["setting"] == "sao" and sao["seed"] == 0 and sao["last_step"] == 4
    assert set(sao["flags"]) >= {"oom", "nan", "stalled", "finished", "crashed", "reward_timeout_rate"}
    assert sao["flags"]["nan"] is True and runs[0]["flags"]["nan"] is False
    assert "mini/sao/seed0/metrics.jsonl" in sao["files"]


def test_api_metrics(server):
    code, body, _ = request(server, "/api/metrics?run=mini/sao/seed0")
    assert code == 200
    d = strict_json(body)  # NaN goes out as null
    assert d["run"] == "mini/sao/seed0" and d["setting"] == "sao" and d["last_step"] == 4
    assert d["metrics"]["acc"] == {"step": [1, 2, 3, 4], "value": [0.1, 0.2, 0.3, None]}
    code, body, _ = request(server, "/api/metrics?run=mini%2Fgrpo%2Fseed1&metrics=acc,dis/kept_frac,nope")
    assert set(strict_json(body)["metrics"]) == {"acc", "dis/kept_frac"}
    assert request(server, "/api/metrics?run=nope")[0] == 404
    assert request(server, "/api/metrics")[0] == 400
    assert request(server, "/api/metrics?run=mini/sao/seed0&max_points=x")[0] == 400


def test_live_updates(server, logs):
    assert strict_json(request(server, "/api/runs")[1])[0]["last_step"] == 3
    with open(logs / "mini" / "grpo" / "seed1" / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "acc": 0.9}\n{"step": 5, "acc": 1.0}\n')
    assert strict_json(request(server, "/api/runs")[1])[0]["last_step"] == 5
    write_run(logs, "grpo_dis", 2)  # a run that starts later appears
    assert "mini/grpo_dis/seed2" in [r["run"] for r in strict_json(request(server, "/api/runs")[1])]
    with open(logs / "mini" / "grpo" / "seed1" / "events.log", "a") as f:
        f.write("2026-11-29T16:01:00\tfinish\t{}\n")
    assert strict_json(request(server, "/api/runs")[1])[0]["flags"]["finished"] is True


def test_numbers_no_float_holds_and_names_not_utf8_neither_drop_nor_hide(server, logs):
    """A line with an integer of 400 digits is skipped and counted, the connection stays up and later steps arrive;
    a run folder or file whose name is not UTF-8 is left out (the JSON is text)."""
    big = b"1" + b"0" * 400
    with open(logs / "mini" / "grpo" / "seed1" / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 4, "acc": %s}\n{"step": 5, "acc": 0.5}\n{"step": %s, "acc": 0.6}\n' % (big, big))
    os.makedirs(os.fsencode(logs) + b"/mini/grpo/se\xffed0")
    with open(os.fsencode(logs) + b"/mini/grpo/se\xffed0/metrics.jsonl", "wb") as f:
        f.write(b'{"step": 1, "acc": 0.5}\n')
    with open(os.fsencode(logs) + b"/mini/grpo/seed1/tr\xffain.log", "wb") as f:
        f.write(b"hello\n")
    code, body, _ = request(server, "/api/runs")
    assert code == 200
    runs = {r["run"]: r for r in strict_json(body)}
    assert set(runs) == {"mini/grpo/seed1", "mini/sao/seed0"}
    grpo = runs["mini/grpo/seed1"]
    assert grpo["last_step"] == 5 and grpo["skipped"]["garbled"] == 2
    assert grpo["files"] == ["mini/grpo/seed1/events.log", "mini/grpo/seed1/metrics.jsonl"]
    with open(logs / "mini" / "grpo" / "seed1" / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "acc": 0.7}\n')
    code, body, _ = request(server, "/api/metrics?run=mini/grpo/seed1&metrics=acc")
    assert code == 200 and strict_json(body)["metrics"]["acc"]["step"] == [1, 2, 3, 5, 6]


def test_a_logs_folder_whose_path_is_not_utf8_is_served(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    root = os.fsdecode(os.fsencode(tmp_path) + b"/r\xffuns")
    write_run(root, "sao", 0)
    srv = serve_in_thread(root, port=0, refresh_s=0.0)
    try:
        code, body, _ = request(srv, "/")
        assert code == 200 and "r\ufffduns" in body.decode("utf-8")  # the byte shown as U+FFFD, the page still served
        code, body, _ = request(srv, "/api/runs")
        assert code == 200 and [r["run"] for r in strict_json(body)] == ["mini/sao/seed0"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_page_static_and_no_cdn(server):
    code, body, headers = request(server, "/")
    assert code == 200 and b"sao-repro monitor" in body and b"static/monitor.js" in body
    assert "script-src 'self'" in headers["Content-Security-Policy"] and headers["X-Content-Type-Options"] == "nosniff"
    js = request(server, "/static/monitor.js")
    css = request(server, "/static/monitor.css")
    assert js[0] == 200 and css[0] == 200 and js[2]["Content-Type"].startswith("text/javascript")
    for text in (body.decode(), js[1].decode(), css[1].decode()):
        assert not re.search(r"https?://|//cdn|unpkg|jsdelivr|googleapis", text)  # nothing loaded from elsewhere
    assert request(server, "/static/nope.js")[0] == 404
    assert request(server, "/api/nope")[0] == 404


def test_files_under_logs_only(server, logs, tmp_path):
    code, body, _ = request(server, "/files/mini/grpo/seed1/events.log")
    assert code == 200 and b"start" in body
    secret = tmp_path / "secret.txt"
    secret.write_text("do not serve")
    os.symlink(secret, logs / "mini" / "link.txt")
    os.symlink(tmp_path, logs / "mini" / "dirlink")
    for path in [
        "/files/../secret.txt",
        "/files/../../etc/passwd",
        "/files/%2e%2e/secret.txt",
        "/files/mini/..%2f..%2fsecret.txt",
        "/files//etc/passwd",
        "/files/mini/link.txt",
        "/files/mini/dirlink/secret.txt",
        "/files/%2fetc%2fpasswd",
        "/files/mini/%00x",
    ]:
        code, body, _ = request(server, path)
        assert code in (403, 404), path
        assert b"do not serve" not in body and b"root:" not in body, path
    assert request(server, "/files/mini/nothing.log")[0] == 404
    for path in ["/api/metrics?run=../../etc/passwd", "/api/metrics?run=%2Fetc%2Fpasswd", "/static/../monitor.py"]:
        assert request(server, path)[0] == 404, path


def test_symlinked_files_out_of_the_tree_are_never_read(server, logs, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "m.jsonl").write_text('{"step": 99, "acc": 1.0}\n')
    (outside / "e.log").write_text('2026-11-29T16:00:00\terror\t{"error": "CUDA out of memory SECRET"}\n')
    d = logs / "mini" / "grpo_dis" / "seed5"
    d.mkdir(parents=True)
    os.symlink(outside / "m.jsonl", d / "metrics.jsonl")
    os.symlink(outside / "e.log", d / "events.log")
    os.symlink(outside / "e.log", d / "stderr.log")
    runs = {r["run"]: r for r in strict_json(request(server, "/api/runs")[1])}
    r = runs["mini/grpo_dis/seed5"]
    assert r["last_step"] is None and not r["flags"]["oom"] and not r["flags"]["crashed"] and r["files"] == []
    assert b"SECRET" not in request(server, "/api/runs")[1]
    assert strict_json(request(server, "/api/metrics?run=mini/grpo_dis/seed5")[1])["metrics"] == {}
    assert request(server, "/files/mini/grpo_dis/seed5/events.log")[0] == 403


def test_dns_rebinding_host_refused(server):
    assert request(server, "/api/runs", host="evil.example.com")[0] == 403
    assert request(server, "/api/runs", host="localhost:8790")[0] == 200


# ---------------------------------------------------------------- keys


def test_admin_needs_key_even_on_loopback(server):
    code, body, _ = request(server, "/api/admin/rescan", method="POST")
    assert code == 403 and KEY_ENV.encode() in body  # disabled without a key


def test_admin_with_key_on_loopback(logs):
    srv = serve_in_thread(logs, port=0, api_key=KEY)
    try:
        assert request(srv, "/api/runs")[0] == 200  # reading stays open on loopback
        assert request(srv, "/api/admin/rescan", method="POST")[0] == 401
        assert request(srv, "/api/admin/rescan", method="POST", headers={"X-API-Key": "wrong"})[0] == 401
        code, body, _ = request(srv, "/api/admin/rescan", method="POST", headers={"X-API-Key": KEY})
        assert code == 200 and strict_json(body)["runs"] == 2
        assert request(srv, "/api/admin/rescan", headers={"X-API-Key": KEY})[0] == 405
        assert request(srv, "/api/admin/nope", method="POST", headers={"X-API-Key": KEY})[0] == 404
    finally:
        srv.shutdown()
        srv.server_close()


def test_non_loopback_refused_without_key(logs, monkeypatch, capsys):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=KEY_ENV):
        make_server(logs, host="0.0.0.0", port=0)
    assert monitor_main(["--logs", str(logs), "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert KEY_ENV in err and "refusing" in err
    monkeypatch.setenv(KEY_ENV, "")
    assert monitor_main(["--logs", str(logs), "--host", "0.0.0.0", "--port", "0"]) == 2


def test_non_loopback_every_request_needs_key(logs):
    srv = serve_in_thread(logs, host="0.0.0.0", port=0, api_key=KEY)
    try:
        for path in [
            "/",
            "/api/runs",
            "/api/metrics?run=mini/sao/seed0",
            "/static/monitor.js",
            "/files/mini/sao/seed0/events.log",
            "/nope",
        ]:
            assert request(srv, path)[0] == 401, path
            assert request(srv, path, headers={"X-API-Key": KEY + "x"})[0] == 401, path
            assert request(srv, path, headers={"Authorization": "Bearer nope"})[0] == 401, path
        assert request(srv, "/api/runs", headers={"X-API-Key": KEY})[0] == 200
        assert request(srv, "/api/runs", headers={"Authorization": f"Bearer {KEY}"})[0] == 200
        assert request(srv, f"/api/runs?key={KEY}")[0] == 200
        assert request(srv, "/api/runs", host="monitor.cluster.internal:1", headers={"X-API-Key": KEY})[0] == 200
        code, page, _ = request(srv, f"/?key={KEY}")
        assert code == 200 and f"static/monitor.js?key={KEY}".encode() in page  # the page reuses its key
        assert request(srv, f"/static/monitor.js?key={KEY}")[0] == 200
        assert request(srv, "/files/../../etc/passwd", headers={"X-API-Key": KEY})[0] == 403
        assert request(srv, "/api/admin/rescan", method="POST")[0] == 401
        assert request(srv, "/api/admin/rescan", method="POST", headers={"X-API-Key": KEY})[0] == 200
    finally:
        srv.shutdown()
        srv.server_close()


def test_page_escapes_and_js_sends_key():
    page = render_page(Path("/logs/<script>"), '"><script>alert(1)</script>')
    assert "<script>alert" not in page and "/logs/&lt;script&gt;" in page
    assert '"X-API-Key": KEY' in JS and "encodeURIComponent(KEY)" in JS
    assert "innerHTML" not in JS  # text goes in via textContent only


# ---------------------------------------------------------------- command line


def test_cli_help():
    with pytest.raises(SystemExit) as e:
        monitor_main(["--help"])
    assert e.value.code == 0


def test_cli_serves_until_stopped(logs, monkeypatch):
    env = dict(os.environ)
    env.pop(KEY_ENV, None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from sao_repro.monitor import monitor_main; sys.exit(monitor_main(sys.argv[1:]))",
            "--logs",
            str(logs),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = p.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line + p.stderr.read()
        c = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=10)
        c.request("GET", "/api/runs")
        r = c.getresponse()
        assert r.status == 200 and len(json.loads(r.read())) == 2
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_start_script():
    script = REPO / "scripts" / "start_monitor.sh"
    assert script.exists() and os.access(script, os.X_OK)
    assert 'sao-repro monitor "$@"' in script.read_text()


def test_script_and_style_are_package_data_served_as_shipped(server):
    "monitor.js / monitor.css are files in sao_repro/monitor/static/, listed as package data, sent byte for byte."
    tomllib = pytest.importorskip("tomllib")
    pkg = REPO / "sao_repro" / "monitor"
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "sao_repro.monitor"
    ]
    shipped = {p.name for g in globs for p in pkg.glob(g)}
    assert shipped == {"monitor.js", "monitor.css"}
    for name in sorted(shipped):
        code, body, headers = request(server, f"/static/{name}")
        assert code == 200 and body == (pkg / "static" / name).read_bytes()
        assert headers["Content-Security-Policy"].startswith("default-src 'none'")
    assert (pkg / "static" / "monitor.js").read_text() == JS and (pkg / "static" / "monitor.css").read_text() == CSS


def test_starved_critic_flag_served_and_listed_by_the_page(tmp_path, monkeypatch):
    "A synthetic starved-critic log: /api/runs carries the flag and its step; the script and style know every SAO flag."
    from sao_repro.metrics.health import SAO_FLAGS

    d = tmp_path / "runs" / "mini" / "sao" / "seed0"
    d.mkdir(parents=True)
    rows = [
        {"step": s, "acc": 0.5, "critic/grad_norm": 7.0 if s > 2 else 0.5, "critic/grad_clip": 1.0} for s in range(1, 7)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.delenv(KEY_ENV, raising=False)
    srv = serve_in_thread(tmp_path / "runs", port=0, refresh_s=0.0)
    try:
        run = strict_json(request(srv, "/api/runs")[1])[0]
    finally:
        srv.shutdown()
        srv.server_close()
    assert run["flags"]["critic_starved"] is True and run["flag_steps"]["critic_starved"] == 5  # steps 3, 4, 5
    assert run["flags"]["critic_flat"] is False
    listed = re.search(r"const FLAGS = \[(.*?)\];", JS, re.S).group(1)
    for f in SAO_FLAGS:
        assert f'"{f}"' in listed and f".flag-{f}" in CSS, f


# ---------------------------------------------------------------- what its user may read
def read_as_served(root) -> dict:
    "What the monitor of `root` lists and serves to this process's user: its data layer and its HTTP API."
    from sao_repro.monitor.data import MonitorState

    st = MonitorState(root, refresh_s=0.0)
    runs = ("open/mini/sao/seed0", "private/mini/sao/seed0", "closed/mini/sao/seed0", "shut/mini/sao/seed0")
    out = {
        "uid": os.geteuid(),
        "state": [r["run"] for r in st.runs()],
        "files": {r["run"]: r["files"] for r in st.runs()},
        "metrics": {run: st.metrics(run) is not None for run in runs},
    }
    srv = serve_in_thread(root, port=0, refresh_s=0.0)
    try:
        code, body, _ = request(srv, "/api/runs")
        out["api_runs"] = [code, [r["run"] for r in json.loads(body)]]
        out["api_metrics"] = {run: request(srv, f"/api/metrics?run={run}")[0] for run in runs}
        out["api_files"] = {
            p: request(srv, f"/files/{p}")[0]
            for p in (
                "open/mini/sao/seed0/metrics.jsonl",
                "open/mini/sao/seed0/train.log",
                "private/mini/sao/seed0/metrics.jsonl",
                "shut/mini/sao/seed0/events.log",
            )
        }
    finally:
        srv.shutdown()
        srv.server_close()
    return out


def as_other_user(fn, *args) -> dict:
    "`fn(*args)` in a child process of user nobody when this one is root (root's override would read anything), else here."
    if os.geteuid() != 0:
        return fn(*args)
    r, w = os.pipe()
    pid = os.fork()  # not exec: the interpreter lives in root's folder, which nobody may enter
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            res = json.dumps({"ok": fn(*args)})
        except BaseException as e:  # reported to the parent
            res = json.dumps({"error": f"{type(e).__name__}: {e}"})
        os.write(w, res.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        res = json.loads(f.read())
    os.waitpid(pid, 0)
    assert "ok" in res, res
    return res["ok"]


def closed_tree():
    "Runs served to another user: one open, one 0700, one 000, one below a 0700 folder, and a 0600 file in the open one."
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="sao-monitor-", dir="/tmp"))  # not under pytest's 0700 folder
    root.chmod(0o755)
    for name in ("open", "private", "closed", "shut"):
        d = write_run(root / name, "sao", 0)
        for p in [d, *d.parents]:
            if p == root:
                break
            p.chmod(0o755)
        for f in d.iterdir():
            f.chmod(0o644)
    (root / "open" / "mini" / "sao" / "seed0" / "train.log").write_text("secret\n")
    (root / "open" / "mini" / "sao" / "seed0" / "train.log").chmod(0o600)
    (root / "private" / "mini" / "sao" / "seed0").chmod(0o700)
    (root / "closed" / "mini" / "sao" / "seed0").chmod(0o000)
    (root / "shut").chmod(0o700)
    return root


def test_the_monitor_serves_only_what_its_user_may_read():
    "Run by another user (nobody, when the tests run as root): the closed runs and the closed file are neither listed nor served."
    import shutil

    root = closed_tree()
    read_as_served(root)  # imports everything the child needs before it gives up root
    try:
        out = as_other_user(read_as_served, root)
    finally:
        for d in ("private/mini/sao/seed0", "closed/mini/sao/seed0", "shut"):
            (root / d).chmod(0o755)
        shutil.rmtree(root)
    assert out["uid"] != 0
    assert out["state"] == ["open/mini/sao/seed0"] and out["api_runs"] == [200, ["open/mini/sao/seed0"]]
    assert out["files"]["open/mini/sao/seed0"] == [
        "open/mini/sao/seed0/events.log",
        "open/mini/sao/seed0/metrics.jsonl",
    ]
    assert out["metrics"] == {
        "open/mini/sao/seed0": True,
        "private/mini/sao/seed0": False,
        "closed/mini/sao/seed0": False,
        "shut/mini/sao/seed0": False,
    }
    assert out["api_metrics"] == {
        "open/mini/sao/seed0": 200,
        "private/mini/sao/seed0": 404,
        "closed/mini/sao/seed0": 404,
        "shut/mini/sao/seed0": 404,
    }
    assert out["api_files"] == {
        "open/mini/sao/seed0/metrics.jsonl": 200,
        "open/mini/sao/seed0/train.log": 404,
        "private/mini/sao/seed0/metrics.jsonl": 404,
        "shut/mini/sao/seed0/events.log": 404,
    }


def test_a_root_monitor_serves_no_run_closed_by_its_mode(tmp_path):
    "Started as root, whose override could read anything, the monitor still follows the mode bits: a 000 run is not served."
    from sao_repro.monitor.data import MonitorState

    a, b = write_run(tmp_path / "runs", "sao", 0), write_run(tmp_path / "runs", "grpo", 1)
    st = MonitorState(tmp_path / "runs", refresh_s=0.0)
    assert [r["run"] for r in st.runs()] == ["mini/grpo/seed1", "mini/sao/seed0"]
    b.chmod(0o000)  # closed while served: it drops out (a user's monitor could not read it either)
    try:
        assert [r["run"] for r in st.runs()] == ["mini/sao/seed0"] and st.metrics("mini/grpo/seed1") is None
        (a / "metrics.jsonl").chmod(0o000)
        assert [r["files"] for r in st.runs()] == [["mini/sao/seed0/events.log"]]
    finally:
        b.chmod(0o755)
        (a / "metrics.jsonl").chmod(0o644)
    assert [r["run"] for r in st.runs()] == ["mini/grpo/seed1", "mini/sao/seed0"]  # reopened: served again


# ---------------------------------------------------------------- idle and half-open connections
def test_monitor_closes_idle_and_half_open_connections(tmp_path):
    import socket
    from sao_repro.monitor import serve_in_thread

    srv = serve_in_thread(tmp_path, port=0)
    srv.idle_timeout = 0.5
    try:
        host, port = srv.server_address[:2]
        socks = [socket.create_connection((host, port), timeout=60) for _ in range(20)]
        for i, s in enumerate(socks):
            if i % 2:
                s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # half a request, never finished
        assert all(s.recv(65536) == b"" for s in socks[::2])  # the server hung up on the silent ones
        for s in socks[1::2]:
            data = s.recv(65536)
            while data:  # possibly a 408 or nothing; then the close
                data = s.recv(65536)
        for s in socks:
            s.close()
    finally:
        srv.shutdown()
        srv.server_close()


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
    p = subprocess.Popen(
        [sys.executable, "-m", "sao_repro.cli", "monitor", "--logs", str(big_log), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
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
                # answered while the log is still loading (done unset): the loader does not hold the server; the
                # bound is generous for a loaded machine (the whole load takes far longer than one bounded read)
                assert status == 200 and secs < 15, (path, secs)
                answered += 1
        time.sleep(0.2)
    t.join(timeout=300)
    assert answered >= 3 and len(first) >= 5  # a 120 MB log: several bounded reads, requests answered in between
    info = {r["run"]: r for r in json.loads(_get(port, "/api/runs")[1])}["mini/sao/seed0"]
    assert not info["loading"] and info["loaded_bytes"] == info["total_bytes"]
    assert info["n_steps"] == N_STEPS and info["skipped"]["non_numeric"] == N_STEPS  # every line read exactly once
    m = json.loads(_get(port, "/api/metrics?run=mini/sao/seed0&metrics=acc&max_points=100000")[1])
    assert m["metrics"]["acc"]["step"] == list(range(N_STEPS))
