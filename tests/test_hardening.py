"""What a crash, a kill, a full disk, a careless option or a hostile name can do to a run, and what it cannot.

Real processes and files throughout: runs killed by signals, logs with torn or garbage tails,
truncated checkpoints, hostile folder names."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sao_repro.mini.cli import compare_main, execute_run, find_run_notebook, run_main
from sao_repro.mini.train import ConfigChangeError, NonFiniteError, RunExistsError, checkpoints, read_metrics, train_run
from mini_helpers import smoke_cache, smoke_cfg, strip_perf  # noqa: F401 (smoke_cache: an autouse fixture)

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


# ---------------------------------------------------------------- 1. a run folder is never silently replaced
def test_fresh_run_into_existing_folder_is_refused(tmp_path, capsys):
    d = train_run(smoke_cfg("grpo", tmp_path, steps=2), log=None)
    before = snapshot(d)
    with pytest.raises(RunExistsError, match="--resume.*--overwrite"):
        train_run(smoke_cfg("grpo", tmp_path, steps=2), log=None)
    args = ["--setting", "grpo", "--out", str(tmp_path), "--steps", "2", *SMOKE_FLAGS]
    assert run_main(args) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err and "Traceback" not in err
    assert snapshot(d) == before  # nothing touched
    assert run_main(args + ["--overwrite"]) == 0
    assert events(d) == ["start", "checkpoint", "finish"]


def test_run_notebook_refuses_existing_folder_before_executing(tmp_path):
    d = train_run(smoke_cfg("grpo", tmp_path, steps=2), log=None)
    (d / "run_setting.ipynb").write_text("{}")  # the executed copy of the earlier run
    before = snapshot(d)
    with pytest.raises(RunExistsError, match="--overwrite"):
        execute_run(find_run_notebook(), "grpo", 0, 2, "mini", str(tmp_path), False, {})
    assert snapshot(d) == before


@pytest.mark.slow
def test_compare_skips_finished_runs_and_refuses_nothing_silently(tmp_path, capsys):
    args = ["--settings", "grpo", "--seeds", "1", "--steps", "2", "--smoke", "--out", str(tmp_path), "--jobs", "1"]
    assert compare_main(args) == 0
    d = tmp_path / "mini" / "grpo" / "seed0"
    before = snapshot(d)
    capsys.readouterr()
    assert compare_main(args) == 0
    assert "1 finished run(s) skipped" in capsys.readouterr().out
    assert snapshot(d) == before


# ---------------------------------------------------------------- 2. resume survives what a crash leaves
def test_resume_after_torn_logs_and_corrupt_checkpoint_equals_uninterrupted(tmp_path):
    full = train_run(smoke_cfg("grpo_dis", tmp_path / "a", steps=6, ckpt_every=2), log=None)
    crash = smoke_cfg("grpo_dis", tmp_path / "b", steps=6, ckpt_every=2, debug_nan_step=5)
    with pytest.raises(NonFiniteError):
        train_run(crash, log=None)
    d = crash.run_dir()
    assert [p.name for p in checkpoints(d)] == ["step_000002.pt", "step_000004.pt"]
    last = checkpoints(d)[-1]
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # a checkpoint cut short by a full disk
    with open(d / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 5, "acc": 0.5, "reward/me')  # a torn write
    with open(d / "events.log", "ab") as f:
        f.write(b"\x00\x00\xff garbage")
    train_run(smoke_cfg("grpo_dis", tmp_path / "b", steps=6, ckpt_every=2), resume=True, log=None)
    a, b = read_metrics(full), read_metrics(d)
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5, 6]  # steps 3-4 recomputed and replaced, not duplicated
    assert strip_perf(a) == strip_perf(b)
    pa, pb = (torch.load(checkpoints(x)[-1], weights_only=False) for x in (full, d))
    assert all(torch.equal(pa["policy"][k], pb["policy"][k]) for k in pa["policy"])
    ev = events(d)
    assert ev[ev.index("repair") : ev.index("resume") + 1] == ["repair", "checkpoint_unreadable", "resume"]
    assert (d / "checkpoints" / "step_000004.pt.unreadable").exists()  # set aside, not deleted
    resume = [json.loads(l.split("\t")[2]) for l in (d / "events.log").read_text().splitlines() if "\tresume\t" in l]
    assert resume[-1]["step"] == 2


def test_read_metrics_skips_garbage_and_absurd_steps(tmp_path):
    lines = [
        b'{"step": 1, "acc": 0.5}',
        b'{"step": 1e30, "acc": 1}',
        b'{"step": -3}',
        b'{"step": NaN}',
        b"\xff\xfe",
        b"[1, 2]",
        b'{"step": 2, "acc": 0.25}',
        b'{"step": 3, "a',
    ]
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join(lines))
    from collections import Counter

    skipped = Counter()
    assert [m["step"] for m in read_metrics(tmp_path, skipped)] == [1, 2]
    assert skipped["bad_line"] == 6


# ---------------------------------------------------------------- 3. --resume compares options
def test_resume_with_changed_option_is_refused_or_recorded(tmp_path, capsys):
    args = ["--setting", "single_dis", "--out", str(tmp_path), "--steps", "2", "--ckpt-every", "1", *SMOKE_FLAGS]
    assert run_main(args) == 0
    d = tmp_path / "mini" / "single_dis" / "seed0"
    before = snapshot(d)
    more = [a if a != "2" else "4" for a in args]
    assert run_main(more + ["--resume", "--lr", "0.001", "--noise", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "lr 0.0001 -> 0.001" in err and "noise 1.0 -> 0.5" in err and "--allow-config-change" in err
    assert snapshot(d) == before
    assert run_main(more + ["--resume"]) == 0  # more steps is not a change of results
    assert (
        run_main([a if a != "4" else "6" for a in more] + ["--resume", "--lr", "0.001", "--allow-config-change"]) == 0
    )
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["lr"] == 0.001 and cfg["changes"] == [{"step": 4, "key": "lr", "old": 0.0001, "new": 0.001}]
    assert "config_change" in events(d)
    with pytest.raises(ConfigChangeError, match="lr"):  # the next resume compares against the changed value
        train_run(smoke_cfg("single_dis", tmp_path, steps=6, ckpt_every=1), resume=True, log=None)


# ---------------------------------------------------------------- 9. Ctrl-C / SIGTERM and argument errors
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


@pytest.mark.parametrize(
    "bad",
    [["--lr", "-1"], ["--noise", "nan"], ["--critic-lr", "inf"], ["--steps", "0"], ["--lag", "-2"], ["--n-eval", "0"]],
)
def test_bad_numbers_exit_2_before_any_folder(bad, tmp_path, capsys):
    assert run_main(["--setting", "sao", "--out", str(tmp_path / "o"), *bad]) == 2
    err = capsys.readouterr().err
    assert bad[0].lstrip("-").replace("-", "_") + "=" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("bad", [["--seeds", "0"], ["--jobs", "0"], ["--window", "0"], ["--steps", "-1"]])
def test_compare_bad_counts_exit_2(bad, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        compare_main(["--out", str(tmp_path / "o"), *bad])
    assert e.value.code == 2 and "must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- 4. prepare-math writes one set
KILL_AFTER_FIRST_FILE = """
import os, signal, sys
import sao_repro.data.prepare as D  # prepare_math looks write_atomic up here
write = D.write_atomic
def write_then_die(path, data):
    write(path, data)
    os.kill(os.getpid(), signal.SIGKILL)  # killed between the files of the set
D.write_atomic = write_then_die
sys.exit(D.prepare_math_main(sys.argv[1:]))
"""


def test_prepare_math_killed_between_files_leaves_the_old_set(tmp_path):
    from sao_repro.data import make_math_fixture, prepare_math_main

    make_math_fixture(tmp_path / "a", n_train=12, n_test=6)
    make_math_fixture(tmp_path / "b", n_train=18, n_test=12)
    out = tmp_path / "data"
    assert prepare_math_main(["--source", str(tmp_path / "a"), "--output", str(out)]) == 0
    old = snapshot(out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_FIRST_FILE, "--source", str(tmp_path / "b"), "--output", str(out)],
        env=env,
        capture_output=True,
    )
    assert r.returncode == -signal.SIGKILL
    assert snapshot(out) == old  # the old set, whole
    assert prepare_math_main(["--source", str(tmp_path / "b"), "--output", str(out)]) == 0
    new = snapshot(out)
    manifest = json.loads(new["manifest.json"])
    import hashlib

    assert all(hashlib.sha256(new[s["file"]]).hexdigest() == s["sha256"] for s in manifest["splits"].values())
    assert manifest["source"] == str(tmp_path / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "data"]  # no staging folder left behind


def test_prepare_math_refuses_a_folder_with_other_files(tmp_path, capsys):
    from sao_repro.data import make_math_fixture, prepare_math_main

    make_math_fixture(tmp_path / "a")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("mine")
    assert prepare_math_main(["--source", str(tmp_path / "a"), "--output", str(tmp_path / "data")]) == 1
    assert "notes.txt" in capsys.readouterr().err and (tmp_path / "data" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("content,words", [(b"", "empty file"), (b'\xff\xfe{"problem": "1"}\n', "not UTF-8")])
def test_prepare_math_bad_source_names_the_file(content, words, tmp_path, capsys):
    from sao_repro.data import prepare_math_main

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.jsonl").write_bytes(content)
    assert prepare_math_main(["--source", str(tmp_path / "src"), "--output", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert words in err and "train.jsonl" in err and "StopIteration" not in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- 6. timeouts and broken reward pools
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_reward_timeouts_must_be_finite_and_positive(bad):
    from sao_repro import reward as R

    with pytest.raises(ValueError, match="timeout_s"):
        R.verify(r"$\boxed{1}$", "1", timeout_s=bad)
    with pytest.raises(ValueError, match="timeout_s"):
        R.RewardConfig(timeout_s=bad)
    with pytest.raises(ValueError, match="timeout_s"):
        R.LocalRewardPool(workers=1, timeout_s=bad)


def test_one_worker_pool_refuses_a_nan_item_timeout_and_keeps_serving():
    from sao_repro.reward import RewardPool

    with RewardPool(backend="local", workers=1, timeout_s=10.0) as pool:
        with pytest.raises(ValueError, match="timeout_s"):
            pool.submit(r"$\boxed{1}$", "1", timeout_s=float("nan"))
        assert pool.submit(r"$\boxed{1}$", "1").result(timeout=120) == 1.0
        assert pool.stats()["reward/submitted"] == 1


def test_verify_recreates_a_pool_broken_at_start_up_and_counts_it():
    from sao_repro import reward as R

    R.close_reward_pool()
    # spawned workers need about a second to start: with a 50 ms start-up limit each is killed before it is ready
    broken = R.RewardPool(backend="local", workers=1, timeout_s=5.0, start_method="spawn", startup_timeout_s=0.05)
    deadline = time.monotonic() + 120
    while broken._impl._broken is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert broken._impl._broken, "the pool did not break"
    from sao_repro.reward import pool as P  # the process-wide pool lives in sao_repro.reward.pool

    with P._DEFAULT_LOCK:
        P._DEFAULT.update(pool=broken, pid=os.getpid())
    before = R.verify_stats()["reward/pool_rebuilds"]
    try:
        assert R.verify(r"so $\boxed{\frac{1}{2}}$", "0.5") == 1.0  # computed by a new pool, not a silent 0.0
        assert R.verify(r"$\boxed{3}$", "4") == 0.0
        assert R.verify_stats()["reward/pool_rebuilds"] == before + 1
    finally:
        R.close_reward_pool()


def test_verify_raises_instead_of_scoring_when_no_pool_can_be_built(monkeypatch):
    from sao_repro import reward as R

    R.close_reward_pool()
    monkeypatch.setenv("SAO_REWARD_TIMEOUT_S", "nan")  # a bad config: no pool can be built
    with pytest.raises(ValueError, match="timeout_s"):
        R.verify(r"$\boxed{1}$", "1")


# ---------------------------------------------------------------- 8. metrics readers and the monitor
def _write_metrics(path: Path, steps, acc=0.5):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, "acc": acc}) + "\n" for s in steps))


def test_readers_skip_and_count_absurd_steps(tmp_path):
    from sao_repro import report as R
    from sao_repro.metrics import scan_runs

    d = tmp_path / "mini" / "sao" / "seed0"
    _write_metrics(d / "metrics.jsonl", [1, 2])
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 1e30, "acc": 1}\n{"step": -5, "acc": 1}\n{"step": 2.5, "acc": 1}\n{"step": 3, "acc": 0.5}\n')
    df, runs_df = R.load_runs(tmp_path)  # raised OverflowError before
    assert sorted(df.step.unique()) == [1, 2, 3]
    assert R.run_summary(df, runs_df, 2, 2).last_step.tolist() == [3]
    assert scan_runs(tmp_path)[0]["skipped"]["bad_step"] == 3


def test_monitor_rereads_a_file_truncated_or_replaced_in_place(tmp_path):
    from sao_repro.metrics import RunStore

    m = tmp_path / "mini" / "sao" / "seed0" / "metrics.jsonl"
    _write_metrics(m, range(1, 41))
    store = RunStore(tmp_path, follow_symlinks=False)
    r = store.refresh()["mini/sao/seed0"]
    assert len(r.steps) == 40
    with open(m, "r+") as f:  # truncated in place, then a new run writes two steps
        f.truncate(0)
        f.write(json.dumps({"step": 1, "acc": 0.9}) + "\n" + json.dumps({"step": 2, "acc": 0.9}) + "\n")
    store.refresh()
    assert sorted(r.steps) == [1, 2] and r.steps[1]["acc"] == 0.9
    new = m.with_name("new.jsonl")  # replaced by another, longer file
    new.write_text("".join(json.dumps({"step": s, "acc": 0.1, "run": "b"}) + "\n" for s in range(1, 61)))
    os.replace(new, m)
    store.refresh()
    assert sorted(r.steps) == list(range(1, 61)) and r.steps[1]["acc"] == 0.1


def test_monitor_holds_a_bounded_downsampled_history(tmp_path):
    from sao_repro.metrics import RunStore

    m = tmp_path / "mini" / "sao" / "seed0" / "metrics.jsonl"
    _write_metrics(m, range(1, 20_001))
    r = RunStore(tmp_path, max_steps=1000).refresh()["mini/sao/seed0"]
    assert len(r.steps) <= 1000 and min(r.steps) == 1 and max(r.steps) == 20_000
    assert list(range(19_600, 20_001)) == sorted(r.steps)[-401:]  # the recent steps are all there


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


# ---------------------------------------------------------------- 5. hostile names and values in the report
EVIL = "x` <img src=x onerror=alert(1)> `<script>alert(2)</script>"


@pytest.mark.slow
def test_report_escapes_hostile_names_and_values_and_forbids_scripts(tmp_path):
    from html.parser import HTMLParser
    from sao_repro import report as R

    runs = tmp_path / "runs"
    for setting in ("sao", EVIL.replace("/", "_")):
        d = runs / "mini" / setting / f"seed0{EVIL.replace('/', '_')}"
        _write_metrics(d / "metrics.jsonl", range(1, 9))
        (d / "config.json").write_text(
            json.dumps(
                {
                    "setting": setting,
                    "seed": 0,
                    "backend": "mini",
                    "ops": EVIL,
                    "difficulty": EVIL,
                    "lag": EVIL,
                    "trajectories_per_step": 16,
                }
            )
        )
    (runs / "mini" / "summary.md").write_text(f"`sao-repro compare --out {EVIL}`\n")
    out = tmp_path / f"report{EVIL.replace('/', '_')}"
    assert R.report_main(["--runs", str(runs), "--out", str(out), "--format", "html", "--engine", "nbconvert"]) == 0
    page = next(out.glob("*.html")).read_text()

    class Tags(HTMLParser):
        found = []

        def handle_starttag(self, tag, attrs):
            self.found.append((tag, dict(attrs)))

    Tags().feed(page)
    handlers = [(t, k) for t, a in Tags.found for k in a if k.lower().startswith("on")]
    assert handlers == []  # no inline event handler made it into the page
    assert not [a for t, a in Tags.found if t == "img" and a.get("src") == "x"]
    assert "alert(2)" not in [s for t, a in Tags.found if t == "script" for s in [a.get("src", "")]]
    assert "<script>alert(2)</script>" not in page
    csp = [a["content"] for t, a in Tags.found if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "script-src 'none'" in csp[0] and "default-src 'none'" in csp[0]
    assert "alert(1)" in page  # the hostile text is shown, as text


# ---------------------------------------------------------------- 7. bounded config and sweep loading
def _bad_configs(tmp_path: Path) -> dict:
    base = (ROOT / "configs" / "phase2_hard_base.yaml").read_text()
    (tmp_path / "phase2_hard_base.yaml").write_text(base)
    head = "defaults:\n  - phase2_hard_base\n  - _self_\n"
    chain = "".join(f'k{i}: "' + (f"${{k{i - 1}}}" if i else "xxxxxxxx") * 2 + '"\n' for i in range(40))
    files = {
        "typo": head + "actr:\n  kl_ctl: 0.0\n",
        "chain": head + "sao:\n  setting: sao\n" + chain,
        "type": head + "seed: not-a-number\n",
    }
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    return {k: str(tmp_path / f"{k}.yaml") for k in files}


def test_config_errors_are_one_message_with_exit_2(tmp_path, capsys):
    from sao_repro.areal.launch import areal_config_main

    bad = _bad_configs(tmp_path)
    for name, words in (("typo", "did you mean actor"), ("chain", "would expand to more than"), ("type", "seed")):
        assert areal_config_main([bad[name], "--dotenv", str(tmp_path / "none.env")]) == 2, name
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, (name, err)


def test_launch_dry_run_reports_each_config_and_ends_with_a_summary(tmp_path, capsys):
    from sao_repro.areal.launch import launch_main

    bad = _bad_configs(tmp_path)
    good = str(ROOT / "configs" / "phase2_hard_sao.yaml")
    rc = launch_main(
        ["--dry-run", "--dotenv", str(tmp_path / "none.env"), bad["typo"], good, bad["chain"]],
        run=lambda *a, **k: subprocess.CompletedProcess(a, 0),
    )
    out, err = capsys.readouterr()
    assert rc == 2
    summary = out[out.index("summary") :]
    assert all(Path(f).name in summary for f in (bad["typo"], good, bad["chain"]))
    assert summary.count("error") == 2 and "dry-run" in summary


def test_billion_laughs_sweep_file_is_refused_before_it_expands(tmp_path, capsys):
    from sao_repro.mini.sweep import sweep_main

    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    (tmp_path / "lol.yaml").write_text("\n".join(lines + ["name: lol", "settings: [sao]", "seeds: 1", "steps: 1"]))
    assert sweep_main([str(tmp_path / "lol.yaml"), "--out", str(tmp_path)]) == 2
    assert "YAML aliases" in capsys.readouterr().err
