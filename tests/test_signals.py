"""How commands and processes end: `ExitOn` (an exception at one step of a command's main -> exit code and one line
on stderr), the batch exits of `compare` and `sweep`, the `--ray` check before any run, and `exit_with_parent` (a
process started by `sao-repro rehearse` ends with it, under both of its old names and in the vLLM server's
environment). A run stopped by Ctrl-C or SIGTERM ends at a step boundary and names `--resume`."""

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from sao_repro.mini.train import checkpoints, read_metrics, train_run
from sao_repro.signals import PARENT_ENV, ExitOn, exit_with_parent
from mini_helpers import smoke_cache, smoke_cfg  # noqa: F401 (smoke_cache: an autouse fixture)
from run_tools import SMOKE_FLAGS, cli, events

ROOT = Path(__file__).resolve().parent.parent


def test_exit_on_maps_the_first_matching_rule_to_its_code_and_one_line(capsys):
    rules = ((ValueError, OSError), 2, "error: "), (FileNotFoundError, 5, "never: "), (KeyboardInterrupt, 130, "x")
    with ExitOn("sao-repro x", *rules) as step:
        raise FileNotFoundError("no such file")  # an OSError: the first rule, not the more specific later one
    assert step.code == 2 and capsys.readouterr().err == "sao-repro x: error: no such file\n"
    with ExitOn("sao-repro x", *rules, lead="\n") as step:
        raise KeyboardInterrupt
    assert step.code == 130 and capsys.readouterr().err == "\nsao-repro x: x\n"
    with ExitOn("sao-repro x", (ValueError, 2, lambda e: f"{type(e).__name__} {e.args[0] * 2}")) as step:
        raise ValueError(21)
    assert step.code == 2 and capsys.readouterr().err == "sao-repro x: ValueError 42\n"


def test_exit_on_lets_a_finished_step_and_other_exceptions_through(capsys):
    with ExitOn("sao-repro x", (ValueError, 2, "")) as step:
        done = True
    assert done and step.code is None
    with pytest.raises(KeyError), ExitOn("sao-repro x", (ValueError, 2, "")) as step:
        raise KeyError("k")
    assert step.code is None and capsys.readouterr().err == ""


def test_batch_exits_of_compare_and_sweep(capsys):
    "Ray refusing after the check: exit 2 with its reason; Ctrl-C: exit 130 with the time the batch ran, below the bar."
    from sao_repro.mini.cli import batch_exits
    from sao_repro.mini.rayconnect import RayUnavailable

    with batch_exits("sao-repro sweep", time.time() - 3.2) as ran:
        raise KeyboardInterrupt
    assert ran.code == 130
    assert capsys.readouterr().err == (
        "\nsao-repro sweep: interrupted after 3 s; finished runs are kept and the others resume: run the same "
        "command again\n"
    )
    with batch_exits("sao-repro compare", time.time()) as ran:
        raise RayUnavailable("the cluster refused the connection")
    assert ran.code == 2 and capsys.readouterr().err == "\nsao-repro compare: the cluster refused the connection\n"
    with pytest.raises(ValueError), batch_exits("sao-repro compare", time.time()):
        raise ValueError("a bug is not an exit code")


def test_ray_ready_without_ray_asks_nobody(monkeypatch, capsys):
    import sao_repro.mini.rayconnect as R

    monkeypatch.setattr(R, "ray_problem", lambda *a: pytest.fail("no --ray: nothing to check"))
    assert R.ray_ready("sao-repro sweep", None) is True and capsys.readouterr().err == ""


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_compare_and_sweep_refuse_a_bad_ray_address_before_any_run(command, tmp_path, monkeypatch, capsys):
    "Both check `--ray` with the same function: exit 2, `sao-repro CMD: --ray ADDR: ...` on stderr, no run folder."
    pytest.importorskip("ray")
    import sao_repro.mini.compare as C  # compare_main looks up _compare_on_ray there
    import sao_repro.mini.sweep as S

    monkeypatch.setattr(C, "_compare_on_ray", lambda *a: pytest.fail("a run started"))
    monkeypatch.setattr(S, "_run_jobs_on_ray", lambda *a: pytest.fail("a run started"))
    monkeypatch.chdir(tmp_path)
    if command == "compare":
        rc = C.compare_main(["--seeds", "1", "--smoke", "--out", "o", "--ray", "no-port-here"])
    else:
        cfg = tmp_path / "s.yaml"
        cfg.write_text(yaml.safe_dump({"name": "s", "settings": ["grpo"], "seeds": 1, "steps": 2}))
        rc = S.sweep_main([str(cfg), "--out", "o", "--ray", "no-port-here"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"sao-repro {command}: --ray no-port-here: not a Ray address"), err
    assert not (tmp_path / "o").exists()


def test_exit_with_parent_needs_the_launcher_as_parent(monkeypatch):
    monkeypatch.delenv(PARENT_ENV, raising=False)
    assert exit_with_parent() is False
    monkeypatch.setenv(PARENT_ENV, str(os.getpid()))  # this process, not its parent
    assert exit_with_parent() is False
    monkeypatch.setenv(PARENT_ENV, "not a pid")
    assert exit_with_parent() is False


def _alive(pid: int) -> bool:
    try:  # a zombie has exited: only its parent's wait is missing
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


CHILD = """
import ctypes, json, os, subprocess, time
from {module} import {name} as watch

libc, sig = ctypes.CDLL(None), ctypes.c_int()
libc.prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
before = sig.value
ok = watch(interval_s=0.1)
libc.prctl(2, ctypes.byref(sig))
g = subprocess.Popen(["sleep", "600"])  # in this process's group, as vLLM's engine processes are
print(json.dumps({{"ok": ok, "before": before, "after": sig.value, "pid": os.getpid(), "grandchild": g.pid}}), flush=True)
time.sleep(600)
"""

LAUNCHER = {  # as sao-repro rehearse starts them: the trainer and the CPU server, and AReaL's vLLM server
    "popen": """
import os, subprocess, sys
subprocess.Popen(sys.argv[1:], start_new_session=True, env={**os.environ, "SAO_PARENT_PID": str(os.getpid())})
""",
    "launch": """
import sys
from sao_repro.areal.vllm_server import launch, server_env
launch(sys.argv[1:], env=server_env() if "venv-vllm" in sys.argv[1] else None)
""",
}


def _server_python():
    from sao_repro.areal.vllm_server import server_python

    try:
        return str(server_python())
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize(
    "module, name, launcher, where",
    [
        ("sao_repro.areal.train", "exit_with_parent", "popen", "here"),
        ("sao_repro.areal.vllm_server", "watch_parent", "launch", "here"),
        ("sao_repro.areal.vllm_server", "watch_parent", "launch", "venv-vllm"),
    ],
)
def test_a_launched_process_group_ends_with_its_launcher(module, name, launcher, where, tmp_path):
    """kill -9 of the launcher: the child's watch SIGKILLs the child's whole group (a grandchild too). Under `launch`
    (parent-death SIGKILL set before exec) the watch lifts that signal, else the child alone would die and leave its
    group behind. In the vLLM server's own environment the shared watch imports as well."""
    py = _server_python() if where == "venv-vllm" else sys.executable
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop(PARENT_ENV, None)
    child = [py, "-c", textwrap.dedent(CHILD.format(module=module, name=name))]
    boss = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER[launcher] + "\nimport time\ntime.sleep(600)\n", *child],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        cwd=tmp_path,
    )
    info, out, t0 = None, [], time.time()
    try:
        while info is None and time.time() - t0 < 240:
            if select.select([boss.stdout], [], [], 1.0)[0]:
                line = boss.stdout.readline().decode(errors="replace")
                if not line:
                    break
                out.append(line)
                info = json.loads(line) if line.startswith("{") else None
        assert info is not None, "".join(out)[-3000:]
        assert info["ok"] is True and info["after"] == 0, info
        assert info["before"] == (signal.SIGKILL if launcher == "launch" else 0), info
        os.kill(boss.pid, signal.SIGKILL)
        boss.wait()
        t1 = time.time()
        while (_alive(info["pid"]) or _alive(info["grandchild"])) and time.time() - t1 < 10:
            time.sleep(0.1)
        assert not _alive(info["pid"]) and not _alive(info["grandchild"]), "the child's group outlived the launcher"
    finally:
        for pid in (info or {}).get("pid"), (info or {}).get("grandchild"):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if boss.poll() is None:
            os.killpg(boss.pid, signal.SIGKILL)
            boss.wait()


# ---------------------------------------------------------------- Ctrl-C / SIGTERM during a run
@pytest.fixture(scope="module")
def warm_start_built(tmp_path_factory):
    "The smoke warm start, built once into this module's cache, so the run below prints nothing while it starts."
    train_run(smoke_cfg("grpo", tmp_path_factory.mktemp("warm"), steps=1), log=None)


@pytest.mark.slow
@pytest.mark.usefixtures("warm_start_built")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_at_a_step_boundary_and_names_resume(sig, tmp_path):
    args = [
        "run",
        "--setting",
        "grpo",
        "--out",
        tmp_path,
        "--steps",
        "400",
        "--ckpt-every",
        "1000",
        "--eval-every",
        "1000",
        *SMOKE_FLAGS,
    ]
    proc = cli(*args)
    m = tmp_path / "mini" / "grpo" / "seed0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while (not m.exists() or m.read_text().count("\n") < 2) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "--resume" in err
    d = m.parent
    ms = read_metrics(d)
    ck = checkpoints(d)
    assert ck[-1].name == f"step_{ms[-1]['step']:06d}.pt"  # nothing computed is lost
    assert events(d)[-1] == "interrupted"
    rec = json.loads((d / "events.log").read_text().splitlines()[-1].split("\t")[2])
    assert rec["signal"] == signal.Signals(sig).name and rec["step"] == ms[-1]["step"]
