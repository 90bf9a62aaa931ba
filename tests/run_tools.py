"""What several test files share: the package's commands run as real processes from this checkout, a smoke run's
options, a run folder's events and bytes, a metrics.jsonl written by hand, one GET of a local server."""

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


SMOKE_FLAGS = ["--preset", "smoke", "--difficulty", "1", "--trajectories-per-step", "16", "--n-eval", "32"]


def events(d: Path) -> list[str]:
    return [l.split("\t")[1] for l in (d / "events.log").read_text().splitlines() if l.count("\t") == 2]


def snapshot(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def cli(*args, env=None) -> subprocess.Popen:
    "`sao-repro ARGS` as a real process using this checkout."
    e = {**os.environ, **(env or {})}
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.Popen(
        [sys.executable, "-m", "sao_repro.cli", *map(str, args)],
        env=e,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _run_args(out, steps, *more):
    return ["--setting", "grpo", "--out", str(out), "--steps", str(steps), "--ckpt-every", "2", *SMOKE_FLAGS, *more]


def _write_metrics(path: Path, steps, acc=0.5):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, "acc": acc}) + "\n" for s in steps))


def _env():
    env = dict(os.environ)
    env.pop("ADMIN_API_KEY", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
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
