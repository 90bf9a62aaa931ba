"""sao_repro.data, the MATH preparation: last-box extraction, the GSM8K-style output, determinism, manifest, offline
failure, a set written whole or not at all, bad sources named."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sao_repro.data import HARD_LEVELS, gold_from_answer, last_boxed, make_math_fixture, prepare_math, prepare_math_main
from run_tools import snapshot

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "text,expected",
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{3} then \boxed{4}", "4"),  # the last box wins
        (r"\fbox{7}", "7"),
        (r"\boxed{1} then \fbox{2}", "2"),
        (r"\fbox{1} then \boxed{2}", "2"),
        (r"$\boxed 5$", "5"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are not grouping
        (r"\boxed{a_{b_{c}}} done", "a_{b_{c}}"),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
        (r"\boxed{x}\\{y}", "x"),  # `\\` is a line break, then a real brace group outside the box
        (r"\boxed{2} \boxed{3", None),  # the last box is unclosed (truncated): no answer
        (r"\boxed{}", None),
        ("no box at all", None),
        (r"\boxedfoo{1}", None),
        ("", None),
        (None, None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_last_boxed_is_linear_on_big_input():
    big = "\\boxed{" * 100_000 + "x" * 1_000_000
    t0 = time.perf_counter()
    assert last_boxed(big) is None
    assert last_boxed(big + "}") == "x" * 1_000_000
    assert time.perf_counter() - t0 < 2.0


def _read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def test_prepare_fixture_schema_and_counts(tmp_path):
    src = make_math_fixture(tmp_path / "src", n_train=12, n_test=6)
    m = prepare_math(tmp_path / "out", source=str(src))
    train = _read_jsonl(tmp_path / "out" / "train.jsonl")
    test = _read_jsonl(tmp_path / "out" / "test.jsonl")
    assert len(train) == 10 and len(test) == 5  # one row in six has no box
    assert m["splits"]["train"]["skipped_no_boxed"] == 2 and m["splits"]["test"]["skipped_no_boxed"] == 1
    raw = [json.loads(x) for x in (src / "train.jsonl").read_text().splitlines()]
    for row in train:
        assert list(row) == ["id", "question", "answer", "level", "type", "solution"]
        assert row["answer"].startswith(row["solution"].rstrip())
        src_row = next(r for r in raw if r["problem"] == row["question"])
        assert gold_from_answer(row["answer"]) == last_boxed(src_row["solution"])
    assert len({r["id"] for r in train}) == len(train)
    # the "last box wins" row of the fixture: first box 4, last box 4*7=28
    r2 = next(r for r in train if "guess" in r["solution"])
    assert gold_from_answer(r2["answer"]) == "28"
    assert sum(m["splits"]["train"]["by_level"].values()) == 10
    assert sum(m["splits"]["train"]["by_type"].values()) == 10
    data = (tmp_path / "out" / "train.jsonl").read_bytes()
    assert m["splits"]["train"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == m
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no temp files left


def test_prepare_is_byte_identical(tmp_path):
    src = make_math_fixture(tmp_path / "src")
    prepare_math(tmp_path / "a", source=str(src))
    prepare_math(tmp_path / "b", source=str(src))
    for name in ["train.jsonl", "test.jsonl", "manifest.json", "README.md"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_ids_stable_under_level_filter(tmp_path):
    src = make_math_fixture(tmp_path / "src")
    prepare_math(tmp_path / "all", source=str(src))
    m = prepare_math(tmp_path / "hard", source=str(src), levels=set(HARD_LEVELS))
    hard = _read_jsonl(tmp_path / "hard" / "train.jsonl")
    full = {r["id"]: r for r in _read_jsonl(tmp_path / "all" / "train.jsonl")}
    assert hard and all(r["level"] == "Level 5" for r in hard)
    assert all(full[r["id"]] == r for r in hard)
    assert m["levels"] == [5] and m["splits"]["train"]["skipped_level"] > 0


def test_parquet_and_math_folder_layout_give_same_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = make_math_fixture(tmp_path / "src")
    rows = [json.loads(x) for x in (src / "train.jsonl").read_text().splitlines()]
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pq" / "train-00000-of-00001.parquet")
    layout = tmp_path / "MATH" / "train" / "algebra"  # original MATH layout: one problem per .json file
    layout.mkdir(parents=True)
    for i, r in enumerate(rows):
        (layout / f"{i:03d}.json").write_text(json.dumps(r))
    prepare_math(tmp_path / "o1", source=str(src), splits=("train",))
    prepare_math(tmp_path / "o2", source=str(tmp_path / "pq"), splits=("train",))
    prepare_math(tmp_path / "o3", source=str(tmp_path / "MATH"), splits=("train",))
    a, b, c = (tmp_path / f"o{i}" / "train.jsonl" for i in (1, 2, 3))
    assert a.read_bytes() == b.read_bytes() == c.read_bytes()


def test_output_loads_with_areal_reader_call(tmp_path):
    import datasets

    src = make_math_fixture(tmp_path / "src")
    prepare_math(tmp_path / "out", source=str(src))
    ds = datasets.load_dataset(
        str(tmp_path / "out"), name="main", split="train", cache_dir=str(tmp_path / "cache")
    )  # how AReaL's GSM8K reader calls it
    assert len(ds) == 10 and "####" in ds[0]["answer"]


def test_schema_error_names_missing_column(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"problem": "p", "solution": r"\boxed{1}"}) + "\n")
    assert prepare_math_main(["--output", str(tmp_path / "o"), "--source", str(tmp_path / "bad.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "missing column" in err and "level" in err


def test_cli_levels_and_splits(tmp_path, capsys):
    src = make_math_fixture(tmp_path / "src")
    rc = prepare_math_main(
        ["--output", str(tmp_path / "o"), "--source", str(src), "--levels", "4", "5", "--splits", "test"]
    )
    assert rc == 0
    assert not (tmp_path / "o" / "train.jsonl").exists()
    rows = _read_jsonl(tmp_path / "o" / "test.jsonl")
    assert rows and {r["level"] for r in rows} <= {"Level 4", "Level 5"}
    assert prepare_math_main(["--output", str(tmp_path / "o"), "--source", str(src), "--levels", "9"]) == 1


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_offline_hub_fails_fast_with_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    t0 = time.perf_counter()
    assert prepare_math_main(["--output", str(tmp_path / "o")]) == 1
    assert time.perf_counter() - t0 < 10
    assert "--source PATH" in capsys.readouterr().err
    assert not (tmp_path / "o" / "train.jsonl").exists()


def test_script_wrapper_runs(tmp_path):
    src = make_math_fixture(tmp_path / "src")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "prepare_math.py"),
            "--output",
            str(tmp_path / "o"),
            "--source",
            str(src),
            "--levels",
            "hard",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "o" / "manifest.json").exists()


# ---------------------------------------------------------------- prepare-math writes one set
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
