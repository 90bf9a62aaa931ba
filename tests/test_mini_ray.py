"""Testbed runs as Ray tasks (sao_repro.mini.raytasks): run folders and the warm start travel packed, results equal
local runs bit for bit, and a sweep over a two-node cluster on this machine survives losing a node. `--ray local`
listens on loopback only and leaves nothing behind however its driver ends; `--ray ADDRESS` must answer as Ray."""

import json
import re
import threading
import time
from pathlib import Path

import pytest
import yaml

from sao_repro.mini.cli import find_run_notebook, make_config, run_params, run_setting
from sao_repro.mini.cli import compare_main
from sao_repro.mini.raytasks import ATTEMPTS_FILE, pack_dir, run_task, start_blobs, unpack_into
from sao_repro.mini.rayconnect import free_ports
from sao_repro.mini.runfolder import run_state
from sao_repro.mini.sweep import sweep_main
from sao_repro.mini.train import read_metrics
from mini_helpers import modes, smoke_cache, strip_perf  # noqa: F401 (smoke_cache: an autouse fixture)

SMOKE = {
    "preset": "smoke",
    "difficulty": 1,
    "trajectories_per_step": 16,
    "n_eval": 32,
    "eval_every": 2,
    "ckpt_every": 2,
}


def start_cluster(Cluster, temp_root, tries=3):
    "A head and a worker node of 1 CPU each, with their own resources and temp folders (a start that times out is retried)."
    for i in range(tries):
        cluster = None
        try:
            cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": 1,
                    "resources": {"head_node": 1},
                    "include_dashboard": False,
                    "temp_dir": f"{temp_root}/head",
                    **free_ports(),
                },
            )
            worker = cluster.add_node(
                num_cpus=1, resources={"worker_node": 1}, temp_dir=f"{temp_root}/worker", **free_ports()
            )
            cluster.wait_for_nodes()
            return cluster, worker
        except Exception:  # "The current node timed out during startup"
            if i == tries - 1:
                raise
            if cluster is not None:
                cluster.shutdown()


def events(run_dir):
    return [l.split("\t")[1] for l in (Path(run_dir) / "events.log").read_text().splitlines()]


def test_a_task_resumes_a_shipped_partial_run_exactly(tmp_path):
    "run_task (outside Ray) resumes a packed 2-step run to 4 steps in a private folder; equals a local 4-step run."
    nb = find_run_notebook()
    local = run_setting("sao", 0, 4, out_dir=str(tmp_path / "local"), overrides=SMOKE, log=None)
    part = run_setting("sao", 0, 2, out_dir=str(tmp_path / "part"), overrides=SMOKE, log=None)
    assert run_state(part, 4) == "partial"
    cfg = make_config("sao", 0, 4, overrides=SMOKE)
    ((key, start),) = start_blobs([cfg], log=None).items()
    r = run_task(
        nb.read_text(),
        run_params("sao", 0, 4, "mini", str(tmp_path / "elsewhere"), False, SMOKE, resume=True),
        pack_dir(part),
        (key, start),
        None,
        ["sao-repro", "sweep", "grid.yaml", "--ray"],  # the driver's command line
    )
    assert r["error"] is None and r["node"] is None
    back = tmp_path / "back"
    unpack_into(r["folder"], back)
    assert not (tmp_path / "elsewhere").exists()  # the task wrote only into its private folder
    assert run_state(back, 4) == "done" and "resume" in events(back)
    assert strip_perf(read_metrics(back)) == strip_perf(read_metrics(local))
    assert (back / "checkpoints").is_dir() and (back / "run_setting.ipynb").exists()
    # its manifest: the first session's, and the task's resume with the driver's command and the same warm start
    m = json.loads((back / "manifest.json").read_text())
    (res,) = m["resumes"]
    assert res["step"] == 2 and res["command"] == ["sao-repro", "sweep", "grid.yaml", "--ray"] and "process" in res
    assert res["data"]["warm_start"]["sha256"] == m["data"]["warm_start"]["sha256"] is not None


@pytest.mark.slow
def test_two_node_sweep_equals_local_runs_and_survives_losing_a_node(tmp_path):
    "A head and a worker node (1 CPU each); runs land on both; the worker is removed mid-sweep; nothing lost or doubled."
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    sweep = {
        "name": "two",
        "settings": ["single_dis", "running_mean"],
        "seeds": 4,
        "steps": 4,
        "window": 2,
        "base": SMOKE,
    }
    cfg = tmp_path / "two.yaml"
    cfg.write_text(yaml.safe_dump(sweep))
    assert sweep_main([str(cfg), "--out", str(tmp_path / "local"), "--jobs", "2"]) == 0
    import tempfile
    from ray._common.utils import get_ray_address_file

    record = Path(get_ray_address_file(None))  # Cluster writes this machine's Ray record, and deletes it at shutdown
    before = record.read_text() if record.is_file() else None
    temp_root = tempfile.mkdtemp(prefix="sao-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    cluster, worker = start_cluster(Cluster, temp_root)
    sessions = {n: Path(n.get_session_dir_path()) for n in (cluster.head_node, worker)}
    assert (
        sessions[cluster.head_node].parent == Path(temp_root) / "head"
        and sessions[worker].parent == Path(temp_root) / "worker"
    )
    assert all(
        d.is_dir() and (d / "logs").is_dir() for d in sessions.values()
    )  # each node keeps its session in its own folder
    root = tmp_path / "ray" / "sweeps" / "two" / "base" / "mini"
    rc = {}
    th = threading.Thread(
        target=lambda: rc.setdefault(
            "rc", sweep_main([str(cfg), "--out", str(tmp_path / "ray"), "--ray", cluster.address])
        )
    )
    try:
        th.start()
        worker_id, t0 = worker.node_id, time.time()
        while time.time() - t0 < 300 and not any(
            json.loads(l)["node"] == worker_id
            for f in root.glob(f"*/seed*/{ATTEMPTS_FILE}")
            for l in f.read_text().splitlines()
        ):
            time.sleep(0.5)
        time.sleep(2)  # the worker has taken its next run: remove the node under it
        cluster.remove_node(worker)
        th.join(600)
    finally:
        ray.shutdown()
        cluster.shutdown()
        import shutil

        shutil.rmtree(temp_root, ignore_errors=True)
        if before is not None:  # as it was before the test
            record.write_text(before)
    assert rc.get("rc") == 0
    nodes = set()
    for s in sweep["settings"]:
        for k in range(sweep["seeds"]):
            d, ref = root / s / f"seed{k}", tmp_path / "local" / "sweeps" / "two" / "base" / "mini" / s / f"seed{k}"
            att = [json.loads(l) for l in (d / ATTEMPTS_FILE).read_text().splitlines()]
            assert [a["error"] for a in att] == [None]  # one result per run (Ray re-ran the lost task itself)
            nodes.add(att[0]["node"])
            assert [m["step"] for m in read_metrics(d)] == [1, 2, 3, 4]
            assert events(d).count("finish") == 1 and "resume" not in events(d)
            assert strip_perf(read_metrics(d)) == strip_perf(read_metrics(ref))  # bit for bit
    assert worker_id in nodes and len(nodes) == 2
    res, ref = (json.loads((tmp_path / x / "sweeps" / "two" / "results.json").read_text()) for x in ("ray", "local"))
    assert res["points"] == ref["points"]


def _marked(mark, under=None):
    "Pids of live processes whose environment carries `mark` (every process a command started inherits it) or that"
    "hold a file under the folder `under` open (Ray's renamed agents and workers may have lost the mark's bytes)."
    import psutil

    out = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if mark.encode() in (p / "environ").read_bytes() or (
                under is not None
                and any(f.path.startswith(f"{under}/") for f in psutil.Process(int(p.name)).open_files())
            ):
                out.append(int(p.name))
        except (OSError, psutil.Error):  # gone meanwhile
            pass
    return out


@pytest.mark.slow
def test_ctrl_c_stops_a_ray_sweep_and_leaves_every_run_resumable(tmp_path):
    "SIGINT to `sao-repro sweep --ray local` (its process group, as a terminal's Ctrl-C): exit 130, no Ray process left, rerun finishes."
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile

    pytest.importorskip("ray")
    sweep = {
        "name": "cc",
        "settings": ["single_dis", "running_mean"],
        "seeds": 2,
        "steps": 6,
        "window": 2,
        "base": {**SMOKE, "eval_every": 2, "ckpt_every": 2},
    }
    cfg = tmp_path / "cc.yaml"
    cfg.write_text(yaml.safe_dump(sweep))
    root = tmp_path / "out" / "sweeps" / "cc" / "base" / "mini"
    run_setting("single_dis", 0, 2, out_dir=str(root.parent), overrides=sweep["base"], log=None)  # a partial run
    assert run_state(root / "single_dis" / "seed0", 6) == "partial"
    mark = f"sao-test-{os.getpid()}-{time.time()}"
    tmp = tempfile.mkdtemp(prefix="sao-t", dir="/tmp")  # the instance's folder goes in it; short for Ray's sockets
    env = {
        **os.environ,
        "SAO_CTRL_C_TEST": mark,
        "TMPDIR": tmp,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    cmd = [sys.executable, "-m", "sao_repro.cli", "sweep", str(cfg), "--out", str(tmp_path / "out"), "--ray", "local"]
    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        t0 = time.time()
        while time.time() - t0 < 400 and p.poll() is None and not list(root.glob(f"*/seed*/{ATTEMPTS_FILE}")):
            time.sleep(0.5)
        time.sleep(2)  # the next runs are in flight
        assert p.poll() is None
        os.killpg(p.pid, signal.SIGINT)
        t1 = time.time()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130 and "interrupted" in err and "run the same command again" in err
    assert time.time() - t1 < 60
    t0 = time.time()
    while _marked(mark, tmp) and time.time() - t0 < 30:
        time.sleep(1)
    assert _marked(mark, tmp) == []  # the Ray instance, its workers and the run kernels are gone
    done = {d for d in root.glob("*/seed*") if run_state(d, 6) == "done"}
    assert 1 <= len(done) < 4
    before = {d: read_metrics(d) for d in done}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{len(done)} finished (skipped)" in r.stdout
    for s in sweep["settings"]:
        for k in range(2):
            d = root / s / f"seed{k}"
            assert [m["step"] for m in read_metrics(d)] == [1, 2, 3, 4, 5, 6]  # each step once
            assert events(d).count("finish") == (2 if (s, k) == ("single_dis", 0) else 1)
            if d in done:
                assert read_metrics(d) == before[d]  # skipped, not run again
    assert "resume" in events(root / "single_dis" / "seed0")
    assert _marked(mark, tmp) == []
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_sweep_with_ray_auto_against_a_ray_start_cluster_equals_local_runs(tmp_path):
    "`ray start --head` (Ray's own CLI, as on a cluster's head node), then `sao-repro sweep CONFIG --ray` (auto, through"
    "RAY_ADDRESS as a cluster job gets it): the runs execute there and equal local runs bit for bit; the head is stopped after."
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    pytest.importorskip("ray")
    sweep = {
        "name": "auto",
        "settings": ["single_dis", "running_mean"],
        "seeds": 2,
        "steps": 4,
        "window": 2,
        "base": SMOKE,
    }
    cfg = tmp_path / "auto.yaml"
    cfg.write_text(yaml.safe_dump(sweep))
    assert sweep_main([str(cfg), "--out", str(tmp_path / "local"), "--jobs", "2"]) == 0
    port, client_port = free_ports()["metrics_agent_port"], free_ports()["metrics_agent_port"]
    temp = tempfile.mkdtemp(prefix="sao-rs-", dir="/tmp")  # short: Ray's socket paths live under it
    mark = f"sao-ray-start-{os.getpid()}-{time.time()}"
    # a private head without token auth (a token in ~/.ray, left by another cluster, would turn it on for the head only)
    env = {**os.environ, "SAO_RAY_START_TEST": mark, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            f"--temp-dir={temp}",
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--ray-client-server-port={client_port}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        seen, address = [], None
        for line in head.stdout:  # `ray start` prints the address other nodes join at, then blocks
            seen.append(line)
            m = re.search(r"ray start --address='([^']+)'", line)
            address = m.group(1) if m else address
            if "--block" in line:
                break
        assert head.poll() is None and address and address.endswith(f":{port}"), "".join(seen)[-3000:]
        from sao_repro.mini.rayconnect import ray_problem

        assert ray_problem(address) is None  # the GCS answers as Ray
        client, t0 = f"ray://{address.rpartition(':')[0]}:{client_port}", time.time()
        while ray_problem(client) and time.time() - t0 < 60:  # the client server starts after `ray start` returns
            time.sleep(1)
        assert ray_problem(client) is None  # and so does its Ray Client server
        r = subprocess.run(
            [sys.executable, "-m", "sao_repro.cli", "sweep", str(cfg), "--out", str(tmp_path / "ray"), "--ray"],
            env={**env, "RAY_ADDRESS": address, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops the node's processes when it is stopped
        try:
            head.wait(60)
        finally:
            t0 = time.time()
            while _marked(mark, temp) and time.time() - t0 < 60:
                time.sleep(1)
            for pid in _marked(mark, temp):
                os.kill(pid, signal.SIGKILL)
            import shutil

            shutil.rmtree(temp, ignore_errors=True)
    root, ref = (
        tmp_path / "ray" / "sweeps" / "auto" / "base" / "mini",
        tmp_path / "local" / "sweeps" / "auto" / "base" / "mini",
    )
    for s in sweep["settings"]:
        for k in range(2):
            att = [json.loads(l) for l in (root / s / f"seed{k}" / ATTEMPTS_FILE).read_text().splitlines()]
            assert len(att) == 1 and att[0]["error"] is None and att[0]["node"]  # one Ray task, on the started head
            assert strip_perf(read_metrics(root / s / f"seed{k}")) == strip_perf(read_metrics(ref / s / f"seed{k}"))
    res, want = (json.loads((tmp_path / x / "sweeps" / "auto" / "results.json").read_text()) for x in ("ray", "local"))
    assert res["points"] == want["points"]
    assert _marked(mark, temp) == []  # nothing of the head outlives it


def test_a_ctrl_c_during_rays_wait_stops_the_batch_and_cancels_what_is_in_flight(tmp_path, monkeypatch):
    "A SIGINT that arrives while the driver waits inside Ray (whose own signal check may take it): the loop keeps it,"
    "stops at its next turn with KeyboardInterrupt (the command's exit 130) and cancels every task in flight."
    import os
    import signal
    from types import SimpleNamespace
    from sao_repro.mini import raytasks

    monkeypatch.setattr(raytasks, "start_blobs", lambda cfgs, log=print: {"k": b""})
    monkeypatch.setattr(raytasks, "start_key", lambda *a: "k")
    submitted, cancelled, waits = [], [], []

    class FakeRay:  # what _run_all asks of Ray, with a wait that meets a Ctrl-C and swallows what it raises
        exceptions = SimpleNamespace(RayError=RuntimeError)

        def remote(self, **kw):
            return lambda fn: SimpleNamespace(options=lambda **o: SimpleNamespace(remote=self._submit))

        def _submit(self, *args):
            submitted.append(object())
            return submitted[-1]

        def put(self, x):
            return x

        def wait(self, refs, num_returns=1, timeout=None):
            waits.append(timeout)
            if len(waits) == 1:
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.2)  # the handler runs here
                except KeyboardInterrupt:
                    pass
            elif len(waits) > 5:
                raise AssertionError("the Ctrl-C was lost: still waiting")
            return [], refs

        def cancel(self, ref, force=False):
            cancelled.append(ref)

    jobs = [
        {"cfg": make_config("grpo", k, 2), "params": {}, "run_dir": tmp_path / f"seed{k}", "name": f"seed{k}"}
        for k in (0, 1)
    ]
    nb = tmp_path / "nb.ipynb"
    nb.write_text("{}")
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        raytasks._run_all(FakeRay(), nb, jobs, None, 1, log=None)
    assert len(submitted) == 2 and sorted(map(id, cancelled)) == sorted(map(id, submitted))
    assert waits[0] is not None and len(waits) <= 2  # a bounded wait: the next turn sees the Ctrl-C
    assert signal.getsignal(signal.SIGINT) is before  # the handler is given back


def test_a_ray_address_nothing_answers_at_is_refused_before_any_run(tmp_path, capsys):
    "`--ray HOST:PORT` with no cluster there: exit 2 within seconds, naming the address and `ray start --head`; no run folder made."
    import socket

    pytest.importorskip("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    cfg = tmp_path / "d.yaml"
    cfg.write_text(yaml.safe_dump({"name": "d", "settings": ["single_dis"], "seeds": 1, "steps": 2, "base": SMOKE}))
    t0 = time.time()
    assert sweep_main([str(cfg), "--out", str(tmp_path / "o"), "--ray", dead]) == 2
    err = capsys.readouterr().err
    assert f"no Ray cluster answers at {dead}" in err and "ray start --head" in err and time.time() - t0 < 30
    assert not (tmp_path / "o" / "sweeps" / "d" / "base").exists()


@pytest.mark.slow
def test_a_relative_critic_init_gives_the_same_runs_with_and_without_ray(tmp_path, monkeypatch):
    "A sweep whose critic_init is relative to the folder it runs in (as chain_critic_warm.yaml writes it), run locally"
    "and under `--ray local`: the same runs (metrics, critic source), config.json names the user's out and critic, and "
    "the run folders have the same modes."
    import os
    import subprocess
    import sys

    pytest.importorskip("ray")
    monkeypatch.chdir(tmp_path)
    run_setting(
        "sao", 0, 2, out_dir="first", overrides=SMOKE, log=None
    )  # the earlier run, named relative to this folder
    sweep = {
        "name": "warm",
        "settings": ["sao"],
        "seeds": 2,
        "steps": 4,
        "window": 2,
        "base": SMOKE,
        "grid": {"critic_init": [None, "first/mini/sao/seed0"]},
    }
    Path("warm.yaml").write_text(yaml.safe_dump(sweep))
    assert sweep_main(["warm.yaml", "--out", "local", "--jobs", "2"]) == 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    r = subprocess.run(
        [sys.executable, "-m", "sao_repro.cli", "sweep", "warm.yaml", "--out", "ray", "--ray", "local"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    src = str(tmp_path / "first" / "mini" / "sao" / "seed0")
    for label, init in (("critic_init=None", None), ("critic_init=first_mini_sao_seed0", src)):
        for k in (0, 1):
            d, ref = (tmp_path / x / "sweeps" / "warm" / label / "mini" / "sao" / f"seed{k}" for x in ("ray", "local"))
            assert strip_perf(read_metrics(d)) == strip_perf(read_metrics(ref)) and len(read_metrics(d)) == 4
            conf, want = (json.loads((x / "config.json").read_text()) for x in (d, ref))
            assert (conf["critic_init"], want["critic_init"]) == (init, init)
            assert conf["critic_source"] == want["critic_source"] and (init is None) == (conf["critic_source"] is None)
            assert conf["out"] == str(tmp_path / "ray" / "sweeps" / "warm" / label)  # the user's, not the task's folder
            got, want_modes = modes(d), modes(ref)  # TensorBoard's event files by folder
            assert {p: m for p, m in got.items() if p != ATTEMPTS_FILE} == want_modes
            assert got[ATTEMPTS_FILE] == want_modes["events.log"]
    res, want = (json.loads((tmp_path / x / "sweeps" / "warm" / "results.json").read_text()) for x in ("ray", "local"))
    assert res["points"] == want["points"]


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _instance(mark, under=None):
    "pid -> (command line, listening IPs) of every live process `_marked(mark, under)` finds (zombies left out)."
    import psutil

    out = {}
    for pid in _marked(mark, under):
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out[pid] = (
                    " ".join(p.cmdline()),
                    {c.laddr.ip for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN},
                )
        except psutil.Error:  # gone meanwhile
            pass
    return out


def _local_sweep(tmp_path, name, seeds, steps, record):
    "`sao-repro sweep --ray local` started with a private TMPDIR (its Ray record is `record`, or none) and a mark in its environment."
    import os
    import subprocess
    import sys
    import tempfile

    sweep = {"name": name, "settings": ["single_dis"], "seeds": seeds, "steps": steps, "window": 2, "base": SMOKE}
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(sweep))
    tmp = Path(tempfile.mkdtemp(prefix="sao-t", dir="/tmp"))  # short: Ray's socket paths live under it
    if record is not None:
        (tmp / "ray").mkdir()
        (tmp / "ray" / "ray_current_cluster").write_text(record)
    mark = f"sao-local-{os.getpid()}-{time.time()}"
    env = {
        **os.environ,
        "SAO_LOCAL_RAY_TEST": mark,
        "TMPDIR": str(tmp),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "sao_repro.cli", "sweep", str(cfg), "--out", str(tmp_path / "out"), "--ray", "local"]
    return (
        subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        ),
        mark,
        tmp,
    )


def _while_a_run_runs(p, mark, under, wait=400):
    "The instance's processes once one of its workers executes a run (the driver still running)."
    t0 = time.time()
    while time.time() - t0 < wait and p.poll() is None:
        inst = _instance(mark, under)
        if any(cmd.startswith("ray::run_task") for cmd, _ in inst.values()):
            return inst
        time.sleep(0.5)
    raise AssertionError(f"no run started (exit {p.poll()}): {p.stderr.read()[-2000:] if p.poll() is not None else ''}")


def _ray_left_in(tmp):
    "What a Ray instance or its runs left in the temp folder `tmp`: instance and run folders, Ray's own folder."
    return sorted(
        str(q.relative_to(tmp))
        for q in Path(tmp).rglob("*")
        if q.relative_to(tmp).parts[0].startswith(("sao-ray", "ray"))
    )


@pytest.mark.slow
def test_a_local_ray_sweep_listens_on_loopback_only_and_leaves_nothing(tmp_path):
    "During `sweep --ray local` every listening socket of the driver, the instance and its workers is on loopback; when"
    "it ends no process of it is left, its folders are gone and the machine's Ray record is as it was."
    import os
    import shutil
    import signal

    pytest.importorskip("ray")
    p, mark, tmp = _local_sweep(tmp_path, "lo", seeds=2, steps=4, record="10.255.0.1:6379")
    try:
        inst = _while_a_run_runs(p, mark, tmp)
        listening = {cmd.split()[0].rsplit("/", 1)[-1]: ips for cmd, ips in inst.values() if ips}
        assert {"gcs_server", "raylet", "ray::run_task"} <= set(listening), listening  # the check is not vacuous
        assert all(ips <= LOOPBACK for ips in listening.values()), listening
        sessions = {d for d in Path(tmp).glob("sao-ray-*/session_2*")}
        assert len(sessions) == 1  # the instance's session, in its own folder
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        assert _instance(mark, tmp) == {}  # nothing of it outlives the command: servers, agents, workers, the warden
        assert _ray_left_in(tmp) == ["ray", "ray/ray_current_cluster"]  # its folders are gone
        assert (Path(tmp) / "ray" / "ray_current_cluster").read_text() == "10.255.0.1:6379"
        root = tmp_path / "out" / "sweeps" / "lo" / "base" / "mini" / "single_dis"
        assert all(run_state(root / f"seed{k}", 4) == "done" for k in range(2))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_a_local_ray_instance_goes_when_its_driver_is_killed(tmp_path):
    "kill -9 of `sweep --ray local` mid-run (as a watchdog would): its Ray processes, agents and run kernels go within"
    "seconds (Ray's own agents alone linger about a minute), its folders are removed, and no Ray record is written."
    import os
    import shutil
    import signal

    pytest.importorskip("ray")
    p, mark, tmp = _local_sweep(tmp_path, "kill", seeds=1, steps=8, record=None)
    try:
        inst = _while_a_run_runs(p, mark, tmp)
        agents = [cmd for cmd, _ in inst.values() if "DashboardAgent" in cmd or "dashboard/agent.py" in cmd]
        assert agents and len(inst) >= 8, inst  # the agents Ray alone would leave running for about a minute
        os.kill(p.pid, signal.SIGKILL)  # the driver alone
        p.wait(30)
        t0 = time.time()
        while (_instance(mark, tmp) or _ray_left_in(tmp)) and time.time() - t0 < 30:
            time.sleep(0.5)
        assert _instance(mark, tmp) == {}
        assert (
            _ray_left_in(tmp) == []
        )  # the instance's folder and the run's private folder are gone; no record was made
    finally:
        for pid in _marked(mark, tmp):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


class _NotRay:
    "A plain HTTP server (every request answered 404) on `host` in a thread."

    def __init__(self, host):
        import http.server

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_error(404)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer((host, 0), H)
        self.address = f"{host}:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.mark.parametrize("command", ["sweep", "compare"])
def test_an_address_that_is_not_ray_is_refused_before_any_run(tmp_path, capsys, monkeypatch, command):
    "`--ray HOST:PORT` and `--ray ray://HOST:PORT` at a plain HTTP server (on 127.0.0.1, and on the address Ray rewrites"
    "127.0.0.1 into): exit 2 within seconds, one line naming the address and what to do, no traceback, no run started."
    pytest.importorskip("ray")
    from ray._private.services import get_node_ip_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = tmp_path / "n.yaml"
    cfg.write_text(yaml.safe_dump({"name": "n", "settings": ["single_dis"], "seeds": 1, "steps": 2, "base": SMOKE}))
    servers = [_NotRay("127.0.0.1"), _NotRay(get_node_ip_address())]
    try:
        for srv in servers:
            for address in (srv.address, f"ray://{srv.address}"):
                out = tmp_path / "o" / address.replace(":", "_").replace("/", "_")
                argv = (
                    [str(cfg), "--out", str(out), "--ray", address]
                    if command == "sweep"
                    else [
                        "--settings",
                        "single_dis",
                        "--seeds",
                        "1",
                        "--steps",
                        "2",
                        "--smoke",
                        "--out",
                        str(out),
                        "--ray",
                        address,
                    ]
                )
                t0 = time.time()
                rc = (sweep_main if command == "sweep" else compare_main)(argv)
                took, err = time.time() - t0, capsys.readouterr().err
                assert rc == 2 and took < 30, (address, rc, took, err)
                assert err.count("\n") == 1 and "Traceback" not in err, err
                assert f"--ray {address}: no Ray cluster answers at {address}" in err and "ray start --head" in err
                if srv is servers[1] or address.startswith("ray://"):  # reached, and found not to be Ray
                    assert "HTTP/2" in err, err
                assert not out.exists() or not any(out.rglob("*")), sorted(out.rglob("*"))
    finally:
        for srv in servers:
            srv.close()
