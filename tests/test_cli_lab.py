"""`sao-repro lab` keeps its token to its owner: never on any process's command line (what `ps` shows every user),
read by the server from a private file; the server's runtime files that hold it are removed on Ctrl-C."""

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cmdlines() -> dict[int, str]:
    "Every process's command line, as `ps` shows it to any user."
    out = {}
    for f in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            out[int(f.parent.name)] = f.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return out


def status(base, token=None):
    req = urllib.request.Request(f"{base}/api/status", headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_lab_token_is_on_no_command_line_and_its_files_go_with_ctrl_c(tmp_path):
    p = subprocess.Popen(
        [sys.executable, "-m", "sao_repro.cli", "lab", "--port", "0", "--no-browser"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        link = None
        t0 = time.monotonic()
        while link is None and time.monotonic() - t0 < 180:
            line = p.stdout.readline()
            assert line or p.poll() is None, "sao-repro lab ended before printing its link"
            m = re.search(r"JupyterLab: (http://127\.0\.0\.1:\d+)/\S*\?token=(\w+)", line)
            link = m and (m[1], m[2])
        assert link, "no link printed"
        base, token = link
        assert status(base, token) == 200 and status(base) == 403  # the token is the server's, and it is needed
        seen = {pid: c for pid, c in cmdlines().items() if token in c}
        assert not seen, f"the token is on a command line: {seen}"
        server = [pid for pid, c in cmdlines().items() if "jupyterlab" in c and f"--ServerApp.root_dir={ROOT}" in c]
        assert server, "no JupyterLab server process"
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{server[0]}/environ").read_text().split("\0") if "=" in kv)
        assert "JUPYTER_TOKEN" not in env  # not in its environment either: a file only its owner can read
        private = Path(env["JUPYTER_TOKEN_FILE"]).parent
        assert private.stat().st_mode & 0o777 == 0o700 and (private / "token").stat().st_mode & 0o777 == 0o600
        runtime = Path(env["JUPYTER_RUNTIME_DIR"])
        assert runtime.parent == private and any(token in f.read_text() for f in runtime.glob("jpserver-*"))
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C in the lab's terminal
        assert p.wait(60) == 0
        assert not private.exists(), "the token's file and the runtime files were left behind"
        assert not [
            pid
            for pid in server
            if Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
        ]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
