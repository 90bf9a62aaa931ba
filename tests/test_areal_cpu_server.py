"""The stand-in server (`sao-repro cpu-server`, sao_repro.areal.cpu_server): bounded, validated, local. A real server
process on the rehearsal's tiny model."""

import http.client
import json
import re
import subprocess
import sys
import time

import pytest

from run_tools import _env, _get


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


@pytest.mark.slow
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
