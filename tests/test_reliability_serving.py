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


# ---------------------------------------------------------------- the report's provenance lines
def _toy_study(runs, settings=("sao", "grpo"), seeds=(0, 1, 2), steps=60):
    "Run folders as the testbed writes them (config.json, metrics.jsonl), with made-up but well-formed numbers."
    for s in settings:
        for k in seeds:
            d = runs / "mini" / s / f"seed{k}"
            d.mkdir(parents=True)
            (d / "config.json").write_text(
                json.dumps(
                    {
                        "setting": s,
                        "seed": k,
                        "backend": "mini",
                        "steps": steps,
                        "trajectories_per_step": 16,
                        "out": str(runs),
                    }
                )
            )
            rows = [
                {
                    "step": i,
                    "acc": (i + k) % 5 / 5,
                    "correct": (i + k) % 5,
                    "incorrect": 5 - (i + k) % 5,
                    "reward/mean": (i % 4) / 4,
                    "dis/masked_below_frac": 0.1,
                    "dis/masked_above_frac": 0.02,
                    "dis/kept_frac": 0.88,
                    "rollout/resp_len": 3.0,
                    **({"critic/explained_var": 0.3, "critic/value_loss": 0.2} if s == "sao" else {}),
                    **({"eval/acc": 0.2 + 0.01 * k + 0.001 * i} if i % 20 == 0 or i == steps else {}),
                }
                for i in range(1, steps + 1)
            ]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_provenance_is_code_compact_and_relative(tmp_path, monkeypatch):
    from sao_repro.report import report_main

    runs, out, elsewhere = tmp_path / "study" / "runs", tmp_path / "study" / "report", tmp_path / "elsewhere"
    _toy_study(runs)
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the runs are outside the current folder, given as absolute paths
    assert report_main(["--runs", str(runs), "--out", str(out), "--engine", "nbconvert"]) == 0
    html = (out / "math_hard_report.html").read_text()
    lines = re.findall(r"run folders:(.*?)Made(.*?)</p>", html, flags=re.S)
    assert len(lines) >= 6
    assert "<code></code>" not in html
    for folders, made in lines:
        assert (
            folders.strip().startswith("<code>runs/mini/") and "<code>sao-repro report --runs runs --out report" in made
        )
    assert "<code>runs/mini/{grpo,sao}/seed{0,1,2}</code>" in html  # six folders in one pattern
    assert "<code>runs/mini/sao/seed{0,1,2}</code>" in html  # the DIS and critic figures: sao only
    assert not re.search(r"mini/(sao|grpo)/seed\d", html.split("<details>")[0].split("</style>")[-1])  # none one by one
    for absolute in (str(tmp_path), str(Path.home()), "/tmp/"):
        assert absolute not in html, absolute


# ---------------------------------------------------------------- rehearse and cpu-server: ports, the run-folder lock
@pytest.mark.parametrize("command", [["rehearse", "--setting", "sao"], ["cpu-server", "--model", "."]])
@pytest.mark.parametrize("port", ["99999", "-1"])
def test_rehearse_and_cpu_server_bad_port_exit_2_without_a_traceback(command, port, tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "sao_repro.cli",
            *command,
            "--port",
            port,
            *(["--out", str(tmp_path)] if command[0] == "rehearse" else []),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "--port" in p.stderr and "0..65535" in p.stderr and "Traceback" not in p.stderr
    assert list(tmp_path.iterdir()) == []


HOLD = (
    "import sys, time; from sao_repro.runlog import lock_run_dir\n"
    "with lock_run_dir(sys.argv[1], 'rehearse'):\n    print('held', flush=True); time.sleep(600)"
)


@pytest.mark.parametrize("extra", [[], ["--resume"], ["--overwrite"]])
def test_second_rehearse_on_a_busy_run_folder_exits_2_naming_the_holder(extra, tmp_path):
    run_dir = tmp_path / "areal" / "sao" / "seed1"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        (run_dir / "main.log").write_text("the first rehearsal's log\n")
        t = time.monotonic()
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "sao_repro.cli",
                "rehearse",
                "--setting",
                "sao",
                "--engine",
                "stand-in",
                "--out",
                str(tmp_path),
                *extra,
            ],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=300,
        )
        assert p.returncode == 2, p.stdout + p.stderr
        assert f"PID {holder.pid}" in p.stderr and "rehearse" in p.stderr and "Traceback" not in p.stderr
        assert "building the tiny model" not in p.stdout  # refused before it started anything
        assert sorted(x.name for x in run_dir.iterdir()) == [".lock", "main.log"]  # --overwrite removed nothing
        assert (run_dir / "main.log").read_text() == "the first rehearsal's log\n"
        assert time.monotonic() - t < 120
    finally:
        holder.kill()
        holder.wait(timeout=30)


# ---------------------------------------------------------------- the stand-in server: bounded, validated, local
def _post(port, path, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(
            "POST",
            path,
            body if isinstance(body, bytes) else json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


@pytest.fixture(scope="module")
def tiny_model():
    from sao_repro.areal.tiny import tiny_assets

    return tiny_assets() / "model"


@pytest.fixture(scope="module")
def cpu_server(tiny_model, tmp_path_factory):
    "`sao-repro cpu-server` on the rehearsal's tiny model, in its own process, one for these tests; yields (port, log path)."
    log = tmp_path_factory.mktemp("cpu_server") / "cpu_server.log"
    p = subprocess.Popen(
        [sys.executable, "-m", "sao_repro.cli", "cpu-server", "--model", str(tiny_model), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=open(log, "w"),
        text=True,
        env=_env(),
    )
    try:
        line = p.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert m, line + log.read_text()
        yield int(m.group(1)), log
    finally:
        p.terminate()
        p.wait(timeout=30)


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"prompt": [1.0, 2.0]}, "token id"),
        ({"prompt": [1, 99999]}, "token id"),
        ({"prompt": "hi"}, "prompt"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"prompt": list(range(300)) * 2}, "positions"),
    ],
)
def test_cpu_server_refuses_bad_sampling_parameters_with_400(cpu_server, bad, words):
    status, body = _post(cpu_server[0], "/v1/completions", {"prompt": [1, 5, 6], "max_tokens": 4, **bad})
    assert status == 400 and words in body["error"], body


def test_cpu_server_nan_top_p_is_400_and_max_tokens_is_capped_at_the_model_length(cpu_server, tiny_model):
    port, log = cpu_server
    status, body = _post(port, "/v1/completions", b'{"prompt": [1, 5, 6], "max_tokens": 4, "top_p": NaN}')
    assert status == 400 and "top_p" in body["error"]
    positions = json.loads((tiny_model / "config.json").read_text())["max_position_embeddings"]
    status, body = _post(port, "/v1/completions", {"prompt": [1, 5, 6], "max_tokens": 1e9, "ignore_eos": True})
    assert status == 200 and len(body["choices"][0]["logprobs"]["tokens"]) == positions - 3
    assert _post(port, "/v1/completions", {"prompt": [1, 5, 6], "max_tokens": 3})[0] == 200  # still serving
    assert "Traceback" not in log.read_text()


def test_cpu_server_updates_weights_only_from_a_local_folder(cpu_server, tiny_model, tmp_path):
    port, log = cpu_server
    for path in ("Qwen/Qwen2-0.5B", str(tmp_path / "missing"), str(tmp_path)):  # a Hub id, no folder, no config.json
        t = time.monotonic()
        status, body = _post(port, "/areal_update_weights", {"model_path": path})
        assert status == 400 and "local model folder" in body["error"] and time.monotonic() - t < 5
    assert "huggingface" not in log.read_text().lower()
    assert _post(port, "/areal_update_weights", {"model_path": str(tiny_model)}) == (
        200,
        {"success": True, "version": 2},
    )


def test_cpu_server_non_loopback_bind_needs_a_key(tiny_model, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "sao_repro.cli",
        "cpu-server",
        "--model",
        str(tiny_model),
        "--host",
        "0.0.0.0",
        "--port",
        "0",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert p.returncode == 2 and "ADMIN_API_KEY" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**_env(), "ADMIN_API_KEY": "k" * 32}
    )
    try:
        m = re.search(r":(\d+)$", p.stdout.readline().strip())
        assert m
        assert _get(int(m.group(1)), "/health")[0] == 200  # this machine's own client (loopback) is trusted
    finally:
        p.terminate()
        p.wait(timeout=30)


@pytest.mark.parametrize("length, code", [("abc", 400), ("-5", 400), (str(10**12), 413)])
def test_cpu_server_bad_content_length_is_a_4xx_not_a_traceback(cpu_server, length, code):
    import socket

    port, log = cpu_server
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\n\r\n{{}}".encode())
        head = s.recv(4096).decode(errors="replace")
    assert head.startswith(f"HTTP/1.1 {code}") and "Content-Length" in head
    assert _post(port, "/v1/completions", {"prompt": [1, 5, 6], "max_tokens": 2})[0] == 200  # still serving
    assert "Traceback" not in log.read_text()


def test_cpu_server_listen_backlog_is_not_5(cpu_server):
    out = subprocess.run(["ss", "-ltnH", f"sport = :{cpu_server[0]}"], capture_output=True, text=True).stdout
    backlog = int(out.split()[2])  # State Recv-Q Send-Q ...: Send-Q of a listening socket is its backlog
    assert backlog >= 128, out


def test_cpu_server_stops_generating_when_the_client_goes_away(cpu_server):
    import socket

    port, log = cpu_server
    long = json.dumps({"prompt": [1, 5, 6], "max_tokens": 1e9, "ignore_eos": True}).encode()
    t = time.monotonic()
    assert _post(port, "/v1/completions", long)[0] == 200
    full = time.monotonic() - t  # a whole answer: the model's length in tokens
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(long), long)
    )
    time.sleep(min(0.3, full / 4))  # its generation has begun and holds the lock
    s.close()  # the client gives up
    t = time.monotonic()
    assert _post(port, "/v1/completions", {"prompt": [1, 5, 6], "max_tokens": 2})[0] == 200
    assert time.monotonic() - t < full / 2, (time.monotonic() - t, full)  # not behind the abandoned generation
