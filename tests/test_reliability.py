"""Nothing lost, nothing counted twice: resume without checkpoints, one process per run folder, sweep files that would
count a run twice, ports, the linear `\\boxed{}` search. Real processes and files throughout."""

import os
import signal
import subprocess
import time

import pytest

from sao_repro.math_answer import last_boxed
from sao_repro.mini.cli import run_main
from sao_repro.mini.sweep import load_sweep, sweep_main
from sao_repro.mini.train import read_metrics
from mini_helpers import smoke_cache  # noqa: F401 (an autouse fixture)
from tb_helpers import assert_tb_matches
from test_hardening import SMOKE_FLAGS, cli, events, snapshot


def _run_args(out, steps, *more):
    return ["--setting", "grpo", "--out", str(out), "--steps", str(steps), "--ckpt-every", "2", *SMOKE_FLAGS, *more]


# ---------------------------------------------------------------- --resume without a readable checkpoint
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


# ---------------------------------------------------------------- sweep files that would count a run twice
SWEEP = {"name": "s", "settings": ["grpo"], "seeds": [0, 1], "steps": 2}


@pytest.mark.parametrize(
    "change, words",
    [
        ({"seeds": [0, 0, 1]}, "seeds: 0 is repeated"),
        ({"grid": {"lr": [0.5, 0.5]}}, "grid.lr: 0.5 is repeated"),
        ({"grid": {"noise": ["a/b", "a_b"]}}, "grid points"),
        ({"name": ".."}, "one plain folder name"),
        ({"name": "."}, "one plain folder name"),
        ({"name": "a\\b"}, "one plain folder name"),
        ({"seeds": [0, -1]}, "integers >= 0"),
        ({"seeds": [0, 1.5]}, "integers >= 0"),
    ],
)
def test_sweep_file_that_would_count_a_run_twice_or_escape_is_refused(change, words, tmp_path, capsys):
    with pytest.raises(ValueError, match=words.replace(".", r"\.")):
        load_sweep({**SWEEP, **change})
    import yaml

    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump({**SWEEP, **change}))
    assert sweep_main([str(f), "--out", str(tmp_path / "out")]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused at load: nothing made


# ---------------------------------------------------------------- ports
@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_monitor_bad_port_exits_2_without_a_traceback(port, tmp_path):
    p = cli("monitor", "--logs", tmp_path, "--port", port)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "0..65535" in err and "Traceback" not in err, err


# ---------------------------------------------------------------- \boxed{} search linear in the text
def test_last_boxed_is_linear_in_the_text():
    def clock(n):
        text = "\\boxed{2}" + "\\boxedx" * n
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            assert last_boxed(text) == "2"
            best = min(best, time.perf_counter() - t0)
        return best

    small, big = clock(40_000), clock(80_000)  # 280 KB and 560 KB
    assert big < 3 * small + 0.01, (small, big)  # quadratic would be 4x
    assert last_boxed("x " * 600_000 + "\\boxed{7}") == "7"  # 1.2 MB solution


def test_verify_scores_a_long_boxedx_tail():
    from sao_repro.reward.check import score

    t0 = time.perf_counter()
    assert score("\\boxed{2}" + "\\boxedx" * 150_000, "2") == 1.0
    assert time.perf_counter() - t0 < 30


# ---------------------------------------------------------------- a run folder whose name is not UTF-8
def test_non_utf8_run_folder_is_skipped_and_named(tmp_path):
    from sao_repro.metrics import collect_metrics, scan_runs

    assert run_main(_run_args(tmp_path / "runs", 2)) == 0
    bad = os.fsencode(tmp_path / "runs" / "mini") + b"/gr\xffpo"
    os.makedirs(bad)
    for name in (b"metrics.jsonl", b"events.log"):
        with open(bad + b"/" + name, "wb") as f:
            f.write((tmp_path / "runs" / "mini" / "grpo" / "seed0" / name.decode()).read_bytes())
    with pytest.warns(UserWarning, match=r"gr\\xffpo.*not UTF-8"):
        df = collect_metrics(tmp_path / "runs")
    assert set(df["run"]) == {"mini/grpo/seed0"}  # the good run is still read
    with pytest.warns(UserWarning, match="not UTF-8"):
        assert [r["run"] for r in scan_runs(tmp_path / "runs")] == ["mini/grpo/seed0"]


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


# ---------------------------------------------------------------- a full disk during a run
@pytest.fixture
def tiny_disk(tmp_path):
    "A 700 KB tmpfs: room for the logs and one smoke checkpoint, not two."
    d = tmp_path / "disk"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700k", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("mount (tmpfs) is not available here")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def test_full_disk_says_so_and_names_the_folder(tiny_disk):
    p = cli("run", *_run_args(tiny_disk, 6, "--ckpt-every", "1"))
    out, err = p.communicate(timeout=300)
    d = tiny_disk / "mini" / "grpo" / "seed0"
    assert p.returncode == 1, err
    assert "disk full" in err and str(d) in err and "--resume" in err, err
    assert "enforce fail" not in err and "Traceback" not in err
    assert not list((d / "checkpoints").glob("*.tmp"))  # the partial checkpoint does not hold the space


# ---------------------------------------------------------------- the rehearsal's cache: checked, rebuilt when damaged


def test_a_damaged_rehearsal_cache_is_named_and_rebuilt_and_a_good_one_kept(tmp_path, capsys):
    from sao_repro.areal.tiny import CACHE_MANIFEST, cache_damage, tiny_assets

    d = tiny_assets(root=tmp_path)
    assert cache_damage(d) is None
    weights = d / "model" / "model.safetensors"
    good, mtime = weights.read_bytes(), weights.stat().st_mtime_ns
    assert tiny_assets(root=tmp_path) == d and weights.stat().st_mtime_ns == mtime  # a good cache is used as it is
    os.truncate(weights, len(good) // 2)  # a torn download / a full disk
    assert "model/model.safetensors has" in cache_damage(d)
    assert tiny_assets(root=tmp_path) == d
    assert "model/model.safetensors has" in capsys.readouterr().err  # it says what it rebuilt and why
    assert weights.read_bytes() == good and cache_damage(d) is None  # the same build again (seeded), intact
    (d / CACHE_MANIFEST).unlink()  # an unfinished build, or one from before the manifest
    (d / "data" / "train.jsonl").write_text("")
    assert "no cache_manifest.json" in cache_damage(d)
    assert (
        tiny_assets(root=tmp_path) == d and cache_damage(d) is None and (d / "data" / "train.jsonl").stat().st_size > 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [d.name]  # no temporary or damaged folder left beside it
