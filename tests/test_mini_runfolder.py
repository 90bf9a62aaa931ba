"""A testbed run folder (sao_repro.mini.runfolder): never silently replaced, resumed from what a crash leaves (torn logs, a
cut checkpoint, no checkpoint, numbers no float holds), its options compared on --resume, one process at a time.
Real runs, processes and files throughout."""

import json
import signal
import subprocess
import time

import pytest
import torch

from sao_repro.mini.cli import execute_run, find_run_notebook, run_main
from sao_repro.mini.train import ConfigChangeError, NonFiniteError, RunExistsError, checkpoints, read_metrics, train_run
from mini_helpers import smoke_cache, smoke_cfg, strip_perf  # noqa: F401 (smoke_cache: an autouse fixture)
from run_tools import SMOKE_FLAGS, _run_args, cli, events, snapshot
from tb_helpers import assert_tb_matches


# ---------------------------------------------------------------- a run folder is never silently replaced
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


# ---------------------------------------------------------------- resume survives what a crash leaves
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


# ---------------------------------------------------------------- --resume compares options
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


# ---------------------------------------------------------------- resume without a readable checkpoint
@pytest.mark.parametrize("damage", ["deleted", "file"])
def test_resume_without_checkpoints_is_refused_and_loses_nothing(damage, tmp_path, capsys):
    assert run_main(_run_args(tmp_path, 4)) == 0
    d = tmp_path / "mini" / "grpo" / "seed0"
    subprocess.run(["rm", "-rf", str(d / "checkpoints")], check=True)
    if damage == "file":
        (d / "checkpoints").write_text("not a folder")
    with open(d / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 5, "ac')  # a torn tail: not cut before the refusal either
    before = snapshot(d)
    capsys.readouterr()
    assert run_main(_run_args(tmp_path, 6, "--resume", "--lr", "0.01")) == 2
    err = capsys.readouterr().err
    assert "4 recorded steps" in err and "--overwrite" in err and "restore" in err and "Traceback" not in err
    assert ("not a folder" if damage == "file" else "missing") in err
    assert snapshot(d) == before  # nothing truncated, nothing renamed
    assert run_main(_run_args(tmp_path, 3, "--overwrite")) == 0  # the other way on
    assert [m["step"] for m in read_metrics(d)] == [1, 2, 3]
    assert len(list((d / "tensorboard").iterdir())) == 1  # the first run's TensorBoard file went with its metrics
    assert_tb_matches(d / "tensorboard", read_metrics(d), ["eval/acc", "reward/mean"])


def test_resume_compares_options_even_without_a_checkpoint(tmp_path, capsys):
    # a run killed before its first checkpoint: nothing to lose, but a changed option is still refused
    assert run_main(_run_args(tmp_path, 1, "--ckpt-every", "1000")) == 0
    d = tmp_path / "mini" / "grpo" / "seed0"
    subprocess.run(["rm", "-rf", str(d / "checkpoints"), str(d / "metrics.jsonl")], check=True)
    capsys.readouterr()
    assert run_main(_run_args(tmp_path, 2, "--resume", "--lr", "0.01")) == 2
    assert "lr 0.0001 -> 0.01" in capsys.readouterr().err


# ---------------------------------------------------------------- a number no float holds in metrics.jsonl
def test_resume_skips_a_number_no_float_holds_and_goes_on(tmp_path, capsys):
    """An integer of 400 digits (json: an int; float() of it: OverflowError) in a step's values and as a step: --resume
    drops both lines like torn ones (a `repair` event counts them) and continues, every time, not stopped for good."""
    assert run_main(_run_args(tmp_path, 4)) == 0
    d = tmp_path / "mini" / "grpo" / "seed0"
    p = d / "metrics.jsonl"
    lines = p.read_text().splitlines()
    big = "1" + "0" * 400
    lines[1] = lines[1].replace('{"step": 2, ', '{"step": 2, "huge": ' + big + ", ", 1)
    p.write_text("\n".join(lines + ['{"step": ' + big + ', "acc": 0.5}']) + "\n")
    assert run_main(_run_args(tmp_path, 6, "--resume")) == 0, capsys.readouterr().err
    assert [m["step"] for m in read_metrics(d)] == [1, 3, 4, 5, 6]
    assert events(d).count("repair") == 1 and '"metrics.jsonl": 2' in (d / "events.log").read_text()
    assert run_main(_run_args(tmp_path, 7, "--resume")) == 0
    assert [m["step"] for m in read_metrics(d)] == [1, 3, 4, 5, 6, 7]


# ---------------------------------------------------------------- one process per run folder
@pytest.mark.slow
def test_second_run_on_a_busy_folder_exits_2_and_a_stale_lock_is_taken_over(tmp_path):
    args = ["run", *_run_args(tmp_path, 100_000, "--ckpt-every", "1", "--eval-every", "100000")]  # never ends by itself
    first = cli(*args)
    m = tmp_path / "mini" / "grpo" / "seed0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while (not m.exists() or m.read_text().count("\n") < 2) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.poll() is None
    for extra in (["--resume"], ["--overwrite"]):
        second = cli(*args, *extra)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert f"PID {first.pid}" in err and "Traceback" not in err
    assert first.poll() is None  # still running: the kill below is what leaves the lock
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    d = m.parent
    assert (d / ".lock").read_text().split("\t")[0] == str(first.pid)  # left behind by the kill
    n = len(read_metrics(d))
    again = cli("run", *_run_args(tmp_path, n + 2, "--ckpt-every", "1", "--eval-every", "100000"), "--resume")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert "stale_lock" in events(d) and not (d / ".lock").exists()
    assert [r["step"] for r in read_metrics(d)] == list(range(1, n + 3))
