"""sao_repro.metrics: metrics.jsonl and AReaL 1.0.4 log parsing (garbage included), flags, windows, the
monitor's run store (files truncated or replaced in place, a bounded history), folder names that are not UTF-8."""

import json
import math
import os
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest

import sao_repro.metrics as M
import sao_repro.metrics.tail as tail
from sao_repro.metrics.health import SAO_FLAGS
from sao_repro.mini.cli import run_main
from sao_repro.metrics import (
    COLUMNS,
    RunReader,
    collect_metrics,
    run_flags,
    scan_runs,
    smooth,
    summarize_runs,
    summarize_settings,
    window,
)
from mini_helpers import smoke_cache  # noqa: F401 (an autouse fixture)
from run_tools import _run_args, _write_metrics

AREAL_FIXTURE = Path(__file__).resolve().parent / "data" / "areal_1.0.4"


def run_dir(root, setting="sao", seed=0, backend="mini"):
    d = Path(root) / backend / setting / f"seed{seed}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def jl(**kw):
    return (json.dumps(kw) + "\n").encode()


def events(d, *names):
    with open(d / "events.log", "a") as f:
        for i, n in enumerate(names):
            f.write(f"2026-11-29T16:00:{i:02d}\t{n}\t{{}}\n")


def flags_of(path, **kw):
    return {r["run"]: r["flags"] for r in scan_runs(path, **kw)}


# ---------------------------------------------------------------- metrics.jsonl


def test_jsonl_tidy_frame_and_garbage(tmp_path):
    d = run_dir(tmp_path, "grpo_dis", 3)
    (d / "metrics.jsonl").write_bytes(
        jl(step=1, acc=0.5, **{"reward/mean": 0.5, "dis/kept_frac": 0.9, "brand_new/key": 7})
        + b"\n"  # blank line: ignored, not counted
        + b"\x00\xff\xfe binary \x89PNG\n"  # binary junk
        + b"{not json at all\n"  # garbled
        + b"[1, 2, 3]\n"  # JSON, but not an object
        + b'{"acc": 0.9}\n'  # no step
        + jl(step=2, correct=3, incorrect=1, note="text value", nested={"a": 1})
        + b'{"step": 3, "acc": NaN, "actor/loss": Infinity}\r\n'
        + b'{"step": 4, "acc": 0.7'
    )  # truncated last line (writer died mid-line)
    df = collect_metrics(tmp_path)
    assert list(df.columns) == COLUMNS
    assert set(df.run) == {"mini/grpo_dis/seed3"} and set(df.setting) == {"grpo_dis"} and set(df.seed) == {3}
    acc = df[df.metric == "acc"].set_index("step").value
    assert acc[1] == 0.5 and acc[2] == 0.75 and math.isnan(acc[3])
    assert 4 not in acc.index
    assert df[(df.metric == "brand_new/key")].value.tolist() == [7.0]  # unknown keys are kept
    assert df[(df.metric == "nested/a")].value.tolist() == [1.0]
    assert df[df.metric == "dis/masked_frac"].value.round(6).tolist() == [0.1]
    skipped = df.attrs["skipped"]["mini/grpo_dis/seed3"]
    assert skipped == {"garbled": 2, "no_step": 2, "non_numeric": 1, "truncated": 1, "too_long": 0}
    assert df.dtypes["value"] == "float64" and df.dtypes["step"] == "int64"


def test_empty_and_missing(tmp_path):
    d = run_dir(tmp_path)
    (d / "metrics.jsonl").write_bytes(b"")
    df = collect_metrics(tmp_path)
    assert df.empty and list(df.columns) == COLUMNS
    assert df.attrs["runs"][0]["last_step"] is None
    assert collect_metrics(tmp_path / "does-not-exist").empty
    assert summarize_runs(df).empty


def test_overlong_line_is_skipped_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(tail, "CHUNK", 1000)
    d = run_dir(tmp_path)
    big = b'{"step": 2, "junk": "' + b"x" * 5000 + b'"}\n'
    (d / "metrics.jsonl").write_bytes(jl(step=1, acc=0.1) + big + b"y" * 7000 + b"\n" + jl(step=3, acc=0.3))
    r = RunReader(d, "r")
    r.tails[d / "metrics.jsonl"] = M.LineTail(d / "metrics.jsonl", max_line=2000)
    r.update(final=True)
    assert sorted(r.steps) == [1, 3]
    assert r.skipped["too_long"] == 2


def test_streams_in_chunks_without_loading_the_file(tmp_path, monkeypatch):
    d = run_dir(tmp_path)
    lines = b"".join(jl(step=i, acc=i / 1000, **{"reward/mean": 0.5}) for i in range(3000))
    (d / "metrics.jsonl").write_bytes(lines)
    monkeypatch.setattr(tail, "CHUNK", 97)  # lines straddle every chunk boundary
    real_read_bytes, real_read_text = Path.read_bytes, Path.read_text

    def guard(fn):
        def wrapped(self, *a, **k):
            assert self.name != "metrics.jsonl", "metrics.jsonl must be streamed, not read whole"
            return fn(self, *a, **k)

        return wrapped

    monkeypatch.setattr(Path, "read_bytes", guard(real_read_bytes))
    monkeypatch.setattr(Path, "read_text", guard(real_read_text))
    df = collect_metrics(tmp_path)
    acc = df[df.metric == "acc"]
    assert len(acc) == 3000 and acc.value.iloc[-1] == pytest.approx(2.999)
    assert df.attrs["skipped"]["mini/sao/seed0"] == {"too_long": 0}


def test_incremental_reads_only_what_was_appended(tmp_path):
    d = run_dir(tmp_path)
    p = d / "metrics.jsonl"
    p.write_bytes(jl(step=1, acc=0.1) + b'{"step": 2, "ac')
    r = RunReader(d, "r")
    assert r.update() is True and sorted(r.steps) == [1]
    assert r.skipped["truncated"] == 0  # pending, not garbage: the writer is mid-line
    with open(p, "ab") as f:
        f.write(b'c": 0.2}\n')
    assert r.update() is True and r.steps[2]["acc"] == 0.2
    assert r.update() is False
    p.write_bytes(jl(step=1, acc=0.9))  # file replaced by a shorter one: start over
    r.update()
    assert r.steps[1]["acc"] == 0.9


def test_identity_from_config_then_path(tmp_path):
    d = run_dir(tmp_path, "running_mean", 4)
    (d / "metrics.jsonl").write_bytes(jl(step=1, acc=0.1))
    assert set(collect_metrics(tmp_path).setting) == {"running_mean"}
    (d / "config.json").write_text(json.dumps({"setting": "single_dis", "seed": 9, "backend": "mini"}))
    df = collect_metrics(tmp_path)
    assert set(df.setting) == {"single_dis"} and set(df.seed) == {9}
    (d / "config.json").write_text("{garbage")
    assert set(collect_metrics(d).setting) == {"running_mean"}
    assert set(collect_metrics(d).run) == {"mini/running_mean/seed4"}  # the run folder itself


# ---------------------------------------------------------------- AReaL logs


def test_areal_fixture_made_by_areal_code(tmp_path):
    """tests/data/areal_1.0.4 was written by AReaL 1.0.4's own logging + tabulate_stats (make_fixture.py)."""
    d = tmp_path / "logs" / "root" / "sao-math" / "trial-seed1"
    d.mkdir(parents=True)
    shutil.copy(AREAL_FIXTURE / "main.log", d)
    df = collect_metrics(tmp_path / "logs")
    assert set(df.run) == {"root/sao-math/trial-seed1"} and set(df.setting) == {"sao"} and set(df.seed) == {1}
    w = df.pivot_table(index="step", columns="metric", values="value", dropna=False)
    assert list(w.index) == [1, 2, 3]
    assert w["acc"].tolist() == pytest.approx([20 / 64, 25 / 64, 30 / 64])
    assert w["reward/mean"].tolist() == pytest.approx([0.3125, 0.39062, 0.46875])
    assert w["dis/kept_frac"].tolist() == pytest.approx([0.95] * 3)
    assert w["rollout/policy_lag"].tolist() == pytest.approx([1.5] * 3)
    assert w["rollout/resp_len"].tolist() == pytest.approx([200, 201, 202])
    assert w["actor/grad_norm"].tolist() == pytest.approx([0.5, 1.5, 2.5])
    assert math.isnan(w.loc[3, "actor/loss"])
    assert w.loc[1, "areal/timeperf/train_step"] == 12.5  # raw keys are kept under areal/
    info = df.attrs["runs"][0]
    assert info["flags"]["finished"] and info["flags"]["nan"] and not info["flags"]["crashed"]
    assert info["skipped"] == {"too_long": 0}


def test_areal_merged_log_alone_and_both(tmp_path):
    a = tmp_path / "merged_only"
    a.mkdir()
    shutil.copy(AREAL_FIXTURE / "merged.log", a)
    b = tmp_path / "both"
    b.mkdir()
    shutil.copy(AREAL_FIXTURE / "merged.log", b)
    shutil.copy(AREAL_FIXTURE / "main.log", b)
    df = collect_metrics(tmp_path)
    acc = df[df.metric == "acc"].pivot_table(index="step", columns="run", values="value")
    assert acc["merged_only"].tolist() == pytest.approx([20 / 64, 25 / 64, 30 / 64])
    assert acc["both"].tolist() == acc["merged_only"].tolist()
    assert (df.groupby(["run", "step", "metric"]).size() == 1).all()


def areal_table(rows):
    width = max(len(k) for k, _ in rows)
    out = ["╒" + "═" * (width + 2) + "╤" + "═" * 12 + "╕"]
    for k, v in rows:
        out.append(f"│ {k.ljust(width)} │ {v:>10} │")
        out.append("├" + "─" * (width + 2) + "┼" + "─" * 12 + "┤")
    out[-1] = "╘" + "═" * (width + 2) + "╧" + "═" * 12 + "╛"
    return "\n".join(out)


def areal_step(n, total, stats, t="16:00:00"):
    head = f"\x1b[92m(AReaL) 20261129-{t}.000 StatsLogger INFO: "
    return (
        f"{head}Epoch 1/1 Step {n}/{total} Train step {n}/{total} done.\x1b[0m\n"
        f"{head}Stats (1/1):\x1b[0m\n{head}\n" + areal_table(stats) + "\x1b[0m\n"
    )


def test_areal_crafted_garbage(tmp_path):
    d = tmp_path / "trial"
    d.mkdir()
    text = (
        areal_table([("ppo_actor/correct_n_seqs", "1.0000e+00")])
        + "\n"  # a table before any step: 1
        + areal_step(
            1,
            10,
            [
                ("ppo_actor/correct_n_seqs", "4.8000e+01"),
                ("ppo_actor/incorrect_n_seqs", "1.6000e+01"),
                ("sao/some_new_stat", "3.0000e+00"),
                ("ppo_actor/update/dis/kept_frac/avg", "9.0000e-01"),
                ("ppo_actor/update/rs_filtered_fraction", "5.0000e-01"),
                ("bad/value", "abc"),
            ],
        )
        + "<BIN> noise from a worker <BIN>\n"
        + areal_step(
            2,
            10,
            [("ppo_actor/correct_n_seqs", "3.2000e+01"), ("ppo_actor/incorrect_n_seqs", "3.2000e+01")],
            t="16:00:30",
        )
        + areal_step(
            3, 10, [("ppo_actor/correct_n_seqs", "1.6000e+01"), ("ppo_actor/incorrect_n_seqs", "4.8000e+01")]
        ).rsplit("\n", 2)[0]
        + "\n│ ppo_actor/task_reward/avg  │ 2.5"
    )  # cut mid-table, mid-row
    (d / "main.log").write_bytes(text.encode().replace(b"<BIN>", b"\x00\xff\xfe\x89"))
    df = collect_metrics(d)
    w = df.pivot_table(index="step", columns="metric", values="value")
    assert w["acc"].tolist() == pytest.approx([0.75, 0.5, 0.25])
    assert w.loc[1, "dis/kept_frac"] == pytest.approx(0.9)  # the SAO subclass's own stat wins
    assert w.loc[1, "areal/sao/some_new_stat"] == 3.0
    assert w.loc[2, "perf/step_s"] == pytest.approx(30.0)
    sk = df.attrs["skipped"]["trial"]
    assert sk["bad_value"] == 1 and sk["bad_row"] == 1 and sk["truncated"] == 1 and "no_step" not in sk
    assert "ppo_actor/task_reward/avg" not in " ".join(df.metric)  # half-written row never used
    info = df.attrs["runs"][0]
    assert info["last_step"] == 3 and not info["flags"]["finished"]


def test_areal_log_with_another_name_and_no_step_lines(tmp_path):
    d = tmp_path / "logs" / "grpo_dis-seed2"
    d.mkdir(parents=True)
    head = "(AReaL) 20261129-16:00:00.000 StatsLogger INFO: "
    tables = "".join(
        f"{head}Stats (1/1):\n{head}\n"
        + areal_table(
            [("ppo_actor/correct_n_seqs", f"{c}.0000e+00"), ("ppo_actor/incorrect_n_seqs", f"{8 - c}.0000e+00")]
        )
        + "\n"
        for c in (2, 4, 6)
    )
    (d / "trainer.out").write_text("launching...\n" + tables)
    (tmp_path / "logs" / "README.txt").write_text("not a run\n")
    df = collect_metrics(tmp_path / "logs")
    assert set(df.run) == {"grpo_dis-seed2"} and set(df.setting) == {"grpo_dis"} and set(df.seed) == {2}
    assert df[df.metric == "acc"].set_index("step").value.to_dict() == {1: 0.25, 2: 0.5, 3: 0.75}


def test_areal_finished_by_step_count(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    (d / "main.log").write_text(
        areal_step(1, 2, [("ppo_actor/correct_n_seqs", "1.0000e+00")])
        + areal_step(2, 2, [("ppo_actor/correct_n_seqs", "1.0000e+00")])
    )
    assert flags_of(d)["t"]["finished"]


# ---------------------------------------------------------------- health flags


def healthy(root, setting="sao", n=5):
    d = run_dir(root, setting)
    (d / "metrics.jsonl").write_bytes(b"".join(jl(step=i, acc=0.5, **{"actor/loss": 0.1}) for i in range(n)))
    events(d, "start")
    return d


def test_healthy_run_has_no_flags(tmp_path):
    healthy(tmp_path)
    f = flags_of(tmp_path)["mini/sao/seed0"]
    assert {k: v for k, v in f.items() if k != "reward_timeout_rate"} == {
        "oom": False,
        "nan": False,
        "stalled": False,
        "finished": False,
        "crashed": False,
        **dict.fromkeys(SAO_FLAGS, False),
    }
    assert f["reward_timeout_rate"] is None


OOM_WORDS = [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity)",
    "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
    "[12345.678] Out of memory: Killed process 4242 (python) total-vm:123kB",
    "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=123.0. Some of your processes may have been killed",
    "Killed",
    "MemoryError",
]


@pytest.mark.parametrize(
    "details",
    [
        {"type": "OutOfMemoryError", "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"},
        {"type": "MemoryError", "error": "MemoryError: ", "step": 4},
        {
            "type": "OutOfMemoryError",
            "error": "OutOfMemoryError: Task was killed due to the node running low on memory.",
        },
    ],
)
def test_oom_flag_from_the_oom_event(tmp_path, details):
    d = healthy(tmp_path)
    with open(d / "events.log", "a") as f:
        f.write(f"2026-11-29T16:01:00+00:00\toom\t{json.dumps(details)}\n")
    f = flags_of(tmp_path)["mini/sao/seed0"]
    assert f["oom"] and f["crashed"] and not f["nan"]


@pytest.mark.parametrize(
    "error",
    [  # run folders written before the oom event: the exception's class, not its words
        "OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')",  # the AReaL backend: repr(e)
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",  # the testbed: Type: message
        "MemoryError()",
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: 8 bytes",
    ],
)
def test_oom_flag_from_an_old_error_event(tmp_path, error):
    d = healthy(tmp_path)
    with open(d / "events.log", "a") as f:
        f.write(f"2026-11-29T16:01:00\terror\t{json.dumps({'error': error})}\n")
    f = flags_of(tmp_path)["mini/sao/seed0"]
    assert f["oom"] and f["crashed"]


@pytest.mark.parametrize("line", OOM_WORDS)
def test_oom_words_in_a_log_set_no_flag(tmp_path, line):
    d = healthy(tmp_path)
    (d / "stderr.log").write_text(f"step 4 ok\n{line}\n")
    f = flags_of(tmp_path)["mini/sao/seed0"]
    assert not f["oom"] and not f["nan"] and not f["crashed"]


def test_no_false_oom(tmp_path):
    d = healthy(tmp_path)
    (d / "stderr.log").write_text("step 1: memory 3.2 GiB\nkilled 3 zombie workers and restarted them\n")
    assert not flags_of(tmp_path)["mini/sao/seed0"]["oom"]


def test_nan_flag_from_metrics_and_events_not_words(tmp_path):
    a = healthy(tmp_path, "sao")
    with open(a / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 9, "actor/loss": NaN}\n')
    b = healthy(tmp_path, "grpo")
    events(b, "nan")
    c = healthy(tmp_path, "grpo_dis")
    (c / "train.log").write_text("step 3\nWARNING: NaN detected in advantages, skipping batch\nstep 4\n")  # words only
    d = healthy(tmp_path, "single_dis")
    with open(d / "metrics.jsonl", "ab") as f:  # NaN in a metric that may be NaN: not a flag
        f.write(b'{"step": 9, "critic/explained_var": NaN, "eval/acc": NaN}\n')
    f = flags_of(tmp_path)
    assert f["mini/sao/seed0"]["nan"] and f["mini/grpo/seed0"]["nan"]
    assert not f["mini/grpo_dis/seed0"]["nan"] and not f["mini/single_dis/seed0"]["nan"]


def test_finished_and_stalled(tmp_path):
    d = healthy(tmp_path)
    old = time.time() - 3600
    for p in d.iterdir():
        os.utime(p, (old, old))
    assert flags_of(tmp_path, stall_minutes=30)["mini/sao/seed0"]["stalled"]
    assert not flags_of(tmp_path, stall_minutes=90)["mini/sao/seed0"]["stalled"]
    assert not flags_of(tmp_path, stall_minutes=30, now=old + 60)["mini/sao/seed0"]["stalled"]
    events(d, "finish")
    os.utime(d / "events.log", (old, old))
    f = flags_of(tmp_path, stall_minutes=30)["mini/sao/seed0"]
    assert f["finished"] and not f["stalled"] and not f["crashed"]


def test_a_traceback_in_a_log_is_no_crash(tmp_path):
    d = healthy(tmp_path)
    tb = 'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n    step()\nRuntimeError: boom\n'
    (d / "train.log").write_text("step 1\nstep 2\n" + tb)  # at the end of the log: still only words
    assert not flags_of(tmp_path)["mini/sao/seed0"]["crashed"]
    events(d, "error")  # the run recorded that an exception ended it
    assert flags_of(tmp_path)["mini/sao/seed0"]["crashed"]


def test_null_is_a_nan_value(tmp_path):
    d = healthy(tmp_path)
    with open(d / "metrics.jsonl", "ab") as f:  # the testbed writes non-finite numbers as null
        f.write(b'{"step": 9, "actor/loss": null, "critic/explained_var": null}\n')
    df = collect_metrics(tmp_path)
    assert df[(df.step == 9)].value.isna().all() and len(df[df.step == 9]) == 2
    assert df.attrs["runs"][0]["flags"]["nan"] and df.attrs["skipped"]["mini/sao/seed0"] == {"too_long": 0}


def test_crashed_by_error_event_unless_finished(tmp_path):
    d = healthy(tmp_path)
    events(d, "error")
    assert flags_of(tmp_path)["mini/sao/seed0"]["crashed"]
    events(d, "resume", "checkpoint")  # resumed after the error
    assert not flags_of(tmp_path)["mini/sao/seed0"]["crashed"]
    events(d, "finish")
    assert flags_of(tmp_path)["mini/sao/seed0"]["finished"]


WORDS = "CUDA out of memory; torch.OutOfMemoryError; loss is nan, NaN detected; Traceback (most recent call last):"


def test_words_in_samples_prompts_and_logs_set_no_failure_flag(tmp_path):
    "A prompt or a completion that says out of memory, NaN or Traceback is text, not an event: no oom / nan / crashed."
    d = healthy(tmp_path)
    with open(d / "metrics.jsonl", "ab") as f:  # text fields beside the numbers (skipped as non-numeric)
        f.write(jl(step=5, acc=0.5, prompt=WORDS, **{"rollout/sample": WORDS, "actor/loss": 0.1}))
    with open(d / "events.log", "a") as f:  # events that carry the words in their details
        f.write(f"2026-11-29T16:01:00\tcheckpoint\t{json.dumps({'path': 'x', 'note': WORDS})}\n")
        f.write(f"2026-11-29T16:01:01\tsample\t{json.dumps({'prompt': WORDS, 'completion': WORDS})}\n")
    tb = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "train.py", line 3',
            "torch.OutOfMemoryError: CUDA out of memory",
            "RuntimeError: loss is nan",
            "Killed",
        ]
    )
    (d / "samples.txt").write_text(f"prompt: {WORDS}\ncompletion: NaN NaN nan inf detected\n")
    (d / "stdout.log").write_text(f"step 5 sample: {WORDS}\n{tb}\n")
    (d / "main.log").write_text(  # AReaL's own logger printing a sample: an ERROR-level line is still words
        f"(AReaL) 20261129-16:00:00.000 RLVRWorkflow ERROR: {WORDS}\n(AReaL) 20261129-16:00:01.000 RLVRWorkflow INFO: "
        "sample says Training completes!\n" + tb + "\n"
    )
    info = scan_runs(tmp_path)[0]
    assert not any(info["flags"][k] for k in ("oom", "nan", "crashed", "finished")), info["flags"]
    assert info["messages"] == []


def test_an_error_event_names_oom_by_class_not_by_message(tmp_path):
    d = healthy(tmp_path)
    with open(d / "events.log", "a") as f:
        f.write(f"2026-11-29T16:01:00\terror\t{json.dumps({'error': 'ValueError: bad answer ' + repr(WORDS)})}\n")
    f = flags_of(tmp_path)["mini/sao/seed0"]
    assert f["crashed"] and not f["oom"] and not f["nan"]


@pytest.mark.parametrize("bad", ["Infinity", "null", "NaN"])
def test_infinite_critic_grad_norm_is_over_the_clip(tmp_path, bad):
    "An inf (or NaN, or null as the testbed writes them) critic grad norm counts as over the clip: critic_starved."
    d = run_dir(tmp_path, "sao")
    rows = [
        f'{{"step": {s}, "acc": 0.5, "critic/grad_clip": 1.0, "critic/grad_norm": {bad if s >= 10 else 0.5}}}\n'
        for s in range(1, 16)
    ]
    (d / "metrics.jsonl").write_text("".join(rows))
    info = scan_runs(tmp_path)[0]
    assert info["flags"]["critic_starved"] and info["flag_steps"]["critic_starved"] == 12
    d.joinpath("metrics.jsonl").write_text("".join(r.replace(f": {bad}}}", ": 0.5}") for r in rows))
    assert not scan_runs(tmp_path)[0]["flags"]["critic_starved"]  # the same run, finite: no flag


def test_reward_timeout_rate(tmp_path):
    d = tmp_path / "areal_run"
    d.mkdir()
    (d / "main.log").write_text(
        areal_step(1, 9, [("ppo_actor/correct_n_seqs", "3.0000e+01"), ("ppo_actor/incorrect_n_seqs", "3.4000e+01")])
        + areal_step(2, 9, [("ppo_actor/correct_n_seqs", "3.0000e+01"), ("ppo_actor/incorrect_n_seqs", "3.4000e+01")])
    )
    (d / "merged.log").write_text(
        "[rollout] (AReaL) 20261129-16:00:00.000 RewardAPI WARNING: Computing reward timeout after 15s (attempt 1/3). Retrying...\n"
        "[rollout] (AReaL) 20261129-16:00:01.000 RewardAPI WARNING: Computing reward timeout after 15s (attempt 3/3). Returning 0.\n"
        "[rollout] (AReaL) 20261129-16:00:02.000 MathVerify WARNING: Timeout (5.0s) in MathVerifyWorker.verify for response='x'\n"
    )
    info = scan_runs(d)[0]
    assert info["reward_timeouts"] == 2
    assert info["flags"]["reward_timeout_rate"] == pytest.approx(2 / 128)
    t = run_dir(tmp_path / "tb")
    (t / "metrics.jsonl").write_bytes(
        jl(step=1, **{"reward/timeout_frac": 0.1}) + jl(step=2, **{"reward/timeout_frac": 0.3})
    )
    assert scan_runs(tmp_path / "tb")[0]["flags"]["reward_timeout_rate"] == pytest.approx(0.2)
    c = run_dir(tmp_path / "pool")  # the reward pools' cumulative counters
    (c / "metrics.jsonl").write_bytes(
        b"".join(jl(step=i, **{"reward/timeouts": i, "reward/done": 64 * i, "acc": 0.5}) for i in range(1, 5))
    )
    assert scan_runs(tmp_path / "pool")[0]["flags"]["reward_timeout_rate"] == pytest.approx(4 / 256)


def test_run_flags_single_folder(tmp_path):
    d = healthy(tmp_path)
    events(d, "finish")
    assert run_flags(d)["finished"]


# ---------------------------------------------------------------- windows and summaries


def study(root):
    for setting, seeds in (("sao", (0, 1)), ("grpo", (0,))):
        for s in seeds:
            d = run_dir(root, setting, s)
            lines = [jl(step=i, acc=(0.2 if i < 100 else 0.6) + 0.1 * s, **{"reward/mean": 1.0}) for i in range(1, 201)]
            (d / "metrics.jsonl").write_bytes(b"".join(lines))


def test_summaries_for_the_report(tmp_path):
    study(tmp_path)
    df = collect_metrics(tmp_path)
    s = summarize_runs(df, start_steps=50, end_steps=50).set_index("run")
    assert s.loc["mini/sao/seed1", "start_acc"] == pytest.approx(0.3)
    assert s.loc["mini/sao/seed1", "end_acc"] == pytest.approx(0.7)
    assert s.loc["mini/grpo/seed0", "delta_acc"] == pytest.approx(0.4)
    assert (s.first_step == 1).all() and (s.last_step == 200).all() and (s.n_steps == 200).all()
    by = summarize_settings(s.reset_index()).set_index("setting")
    assert by.loc["sao", "n_seeds"] == 2 and by.loc["sao", "end_acc_mean"] == pytest.approx(0.65)
    st = window(df[df.metric == "acc"], "start", 50)
    assert st.groupby("run").step.max().tolist() == [50, 50, 50]
    en = window(df[df.metric == "acc"], "end", 50)
    assert en.groupby("run").step.min().tolist() == [151, 151, 151]


def test_smoothing(tmp_path):
    df = pd.DataFrame(
        {"run": "r", "setting": "sao", "seed": 0, "step": [3, 1, 2, 4], "metric": "acc", "value": [1.0, 0.0, 0.0, 1.0]}
    )
    r = smooth(df, window=2)
    assert r.step.tolist() == [1, 2, 3, 4] and r.value.tolist() == [0.0, 0.0, 0.5, 1.0]
    e = smooth(df, window=3, method="ema")  # alpha = 2 / (3 + 1) = 0.5, adjusted weights
    assert e.value.iloc[0] == 0.0 and 0.5 < e.value.iloc[2] < 1.0
    with pytest.raises(ValueError, match="rolling"):
        smooth(df, method="median")


# ---------------------------------------------------------------- setting names, layering


def test_setting_names_in_paths_come_from_the_registry(tmp_path):
    "A setting registered after import is read from a run's path; no hard-coded list of names remains."
    from sao_repro.settings import SETTINGS, Setting, register_setting

    assert not hasattr(M, "KNOWN_SETTINGS")
    d = run_dir(tmp_path, setting="sao_k4", seed=3)
    (d / "metrics.jsonl").write_bytes(jl(step=1, acc=0.5))
    assert RunReader(d, "x").identity["setting"] == "sao"  # not registered: the longest registered name in the path
    register_setting(Setting("sao_k4", "SAO with four critic passes", critic=True, critic_k=4, advantage="gae"))
    try:
        assert RunReader(d, "mini/sao_k4/seed3").identity == {"setting": "sao_k4", "seed": 3, "backend": "mini"}
        assert RunReader(run_dir(tmp_path, setting="grpo_dis"), "y").identity["setting"] == "grpo_dis"
    finally:
        del SETTINGS["sao_k4"]


def test_backends_do_not_import_the_metrics_reader():
    "The trainers write metrics.jsonl through sao_repro.runlog; nothing in a backend imports the readers above it."
    import ast

    pkg = Path(M.__file__).resolve().parents[1]  # sao_repro/
    backends = [f"mini/{m}" for m in ("task", "transformer", "model", "rollout", "train")] + [
        f"areal/{m}" for m in ("config", "algo", "ppo_trainer", "engine", "train", "cpu_generator", "cpu_server")
    ]
    for f in [pkg / f"{m}.py" for m in backends + ["runlog"]]:
        for node in ast.walk(ast.parse(f.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for n in names:
                assert not n.split(".")[-1].startswith(("metrics", "monitor", "report")), f"{f.name} imports {n}"
    trainer = ast.parse((pkg / "areal" / "ppo_trainer.py").read_text())
    assert any(
        isinstance(n, ast.ImportFrom)
        and (n.module or "").endswith("runlog")
        and "areal_to_metrics" in [a.name for a in n.names]
        for n in ast.walk(trainer)
    )


# ---------------------------------------------------------------- SAO health flags, read from a run folder


def sao_log(root, n=30, **per_step):
    d = run_dir(root, "sao")
    rows = [
        {"step": s, "acc": 0.5, **{k: (f(s) if callable(f) else f) for k, f in per_step.items()}}
        for s in range(1, n + 1)
    ]
    (d / "metrics.jsonl").write_bytes(b"".join(jl(**r) for r in rows))
    return d


def test_starved_critic_log_sets_the_flag_and_its_step(tmp_path):
    sao_log(
        tmp_path,
        **{
            "critic/grad_norm": lambda s: 40.0 if s >= 10 else 0.5,
            "critic/grad_clip": 1.0,
            "critic/explained_var": 0.4,
        },
    )
    info = scan_runs(tmp_path)[0]
    assert info["flags"]["critic_starved"] and info["flag_steps"]["critic_starved"] == 12
    assert not any(info["flags"][f] for f in SAO_FLAGS if f != "critic_starved")


def test_healthy_critic_log_sets_no_sao_flag(tmp_path):
    sao_log(
        tmp_path,
        n=80,
        **{
            "critic/grad_norm": lambda s: 5.0 if s % 2 else 0.5,
            "critic/grad_clip": 1.0,
            "critic/explained_var": lambda s: min(0.45, -0.4 + 0.05 * s),
            "critic/returns_std": 0.3,
            "adv/max": 0.8,
            "dis/kept_frac": 0.95,
        },
    )
    info = scan_runs(tmp_path)[0]
    assert not any(info["flags"][f] for f in SAO_FLAGS) and set(info["flag_steps"].values()) == {None}


def test_degenerate_step_is_marked_not_a_huge_negative(tmp_path):
    sao_log(
        tmp_path,
        n=4,
        **{
            "critic/returns_std": lambda s: 0.0 if s == 2 else 0.5,
            "critic/explained_var": lambda s: -3e7 if s == 2 else 0.3,
        },
    )
    df = collect_metrics(tmp_path)
    ev = df[df.metric == "critic/explained_var"].set_index("step").value
    assert math.isnan(ev[2]) and ev[1] == 0.3
    assert df[(df.metric == "critic/returns_degenerate")].step.tolist() == [2]
    assert scan_runs(tmp_path)[0]["flag_steps"]["degenerate_returns"] == 2


# ---------------------------------------------------------------- names that are not UTF-8, numbers no float holds

BIG = "1" + "0" * 400  # json reads it as an int; float() of it raises OverflowError


def test_names_not_utf8_at_any_depth_are_skipped_and_named(tmp_path):
    good = run_dir(tmp_path, "sao", 0)
    (good / "metrics.jsonl").write_bytes(jl(step=1, acc=0.5) + jl(step=2, acc=0.6))
    root = os.fsencode(tmp_path)
    bad_dirs = (b"/mini/grpo/se\xffed0", b"/mini/gr\xffpo/seed0", b"/m\xffini/sao/seed0", b"/mini/sao/seed0/sub\xff")
    for bad in bad_dirs:
        os.makedirs(root + bad)
        with open(root + bad + b"/metrics.jsonl", "wb") as f:
            f.write(jl(step=1, acc=0.9))
    with open(root + b"/mini/sao/seed0/tr\xffain.log", "wb") as f:  # a log file of the good run
        f.write(b"Traceback (most recent call last):\nRuntimeError: CUDA out of memory.\n")
    with pytest.warns(UserWarning) as w:
        df = collect_metrics(tmp_path)
        infos = scan_runs(tmp_path)
    said = " ".join(str(x.message) for x in w)
    for name in (b"se\\xffed0", b"gr\\xffpo", b"m\\xffini", b"sub\\xff", b"tr\\xffain.log"):
        assert name.decode() in said and "not UTF-8" in said, (name, said)
    assert set(df.run) == {"mini/sao/seed0"} and df[df.metric == "acc"].value.tolist() == [0.5, 0.6]
    assert [i["run"] for i in infos] == ["mini/sao/seed0"]
    assert not infos[0]["flags"]["crashed"] and not infos[0]["flags"]["oom"]  # the skipped log is not read
    json.dumps(infos, ensure_ascii=False).encode("utf-8")  # every name in what the readers return is text


def test_a_number_no_float_holds_skips_its_line_like_a_torn_one(tmp_path):
    d = run_dir(tmp_path, "grpo", 0)
    (d / "metrics.jsonl").write_bytes(
        jl(step=1, acc=0.5)
        + b'{"step": 2, "acc": %s}\n' % BIG.encode()
        + b'{"step": %s, "acc": 0.1}\n' % BIG.encode()
        + b'{"step": 3, "acc": 0.7, "nested": {"x": -%s}}\n' % BIG.encode()
        + jl(step=4, acc=0.8)
        + b'{"step": 5, "acc": %s' % BIG.encode()
    )
    df = collect_metrics(tmp_path)
    assert df[df.metric == "acc"].set_index("step").value.to_dict() == {1: 0.5, 4: 0.8}  # the lines after are read
    assert df.attrs["skipped"]["mini/grpo/seed0"] == {"garbled": 3, "truncated": 1, "too_long": 0}
    r = RunReader(d, "r")  # the monitor's incremental reader: the same, and steps appended later still arrive
    r.update()
    with open(d / "metrics.jsonl", "ab") as f:
        f.write(b"\n" + jl(step=6, acc=0.9))
    r.update()
    assert sorted(r.steps) == [1, 4, 6] and r.skipped["garbled"] == 4  # the torn tail, completed with a newline, too


# ---------------------------------------------------------------- absurd steps; the monitor's run store: a file replaced in place, a bounded history
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
