"""manifest.json in every run folder (sao_repro.manifest): what a testbed run and the AReaL backend record, a resume's
session kept beside the first, and the report's manifest table and differences."""

import hashlib
import html
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sao_repro.manifest import MANIFEST_FILE, PACKAGES, manifest_differences, read_manifest, write_manifest
from sao_repro.mini.model import cache_root
from sao_repro.mini.train import train_run
from mini_helpers import smoke_cache, smoke_cfg  # noqa: F401 (smoke_cache: an autouse fixture)

ROOT = Path(__file__).resolve().parent.parent


def git(*args) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_testbed_run_records_commit_versions_hardware_warm_start_and_command(tmp_path):
    "A testbed run's manifest: this checkout's commit and changes, versions, CPUs, the warm start's sha256, the command; a resume adds a session."
    d = train_run(smoke_cfg("grpo", tmp_path, steps=2), log=None)
    m = json.loads((d / MANIFEST_FILE).read_text())
    assert (m["schema"], m["backend"]) == (1, "mini")
    assert m["package"]["commit"] == git("rev-parse", "HEAD") and m["package"]["source"] == "git"
    assert m["package"]["dirty"] == bool(git("status", "--porcelain"))
    assert set(m["versions"]) == {"python", *PACKAGES}
    assert m["versions"]["torch"] == importlib.metadata.version("torch")
    assert m["versions"]["numpy"] == importlib.metadata.version("numpy")
    assert m["hardware"]["cpus"] == os.cpu_count() and isinstance(m["hardware"]["gpus"], list)
    key = json.loads((d / "config.json").read_text())["warm_start"]["key"]
    start = cache_root() / "mini" / key / "start.pt"
    assert m["data"]["warm_start"]["sha256"] == hashlib.sha256(start.read_bytes()).hexdigest()
    assert m["data"]["warm_start"]["bytes"] == start.stat().st_size
    assert "critic_init" not in m["data"]  # a run without a critic warm start reads no such file
    launcher = os.environ.get("SAO_REPRO_COMMAND")  # set when this process launched a notebook run before
    assert m["command"] == (json.loads(launcher) if launcher else [sys.executable, *sys.orig_argv[1:]])
    # a resume keeps the first session and appends its own, with the step it continued from
    train_run(smoke_cfg("grpo", tmp_path, steps=4), resume=True, log=None)
    m2 = read_manifest(d)
    assert m2["time"] == m["time"] and [r["step"] for r in m2["resumes"]] == [2]
    assert m2["resumes"][0]["package"]["commit"] == m["package"]["commit"]
    # a fresh run over it (overwrite) starts a new manifest
    train_run(smoke_cfg("grpo", tmp_path, steps=2), overwrite=True, log=None)
    assert "resumes" not in read_manifest(d)


def test_areal_backend_writes_the_manifest_with_data_and_critic_hashes(tmp_path, monkeypatch):
    "The AReaL backend's run folder (rank 0's start): manifest.json with the MATH file's and the critic warm start's sha256."
    pytest.importorskip("areal")
    import areal.api.cli_args as cli_args
    from sao_repro.areal import train as T
    from sao_repro.areal.config import load_sao_config
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    ck = tmp_path / "ck" / "globalstep5"
    cfg_kw = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1)
    Qwen2ForTokenClassification(
        Qwen2Config(**cfg_kw, num_attention_heads=2, num_key_value_heads=1, num_labels=1)
    ).save_pretrained(ck)
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    run = tmp_path / "run"
    cfg = load_sao_config(
        ROOT / "configs" / "phase2_hard_sao.yaml",
        [f"sao.run_dir={run}", f"sao.critic_init={ck}", f"cluster.fileroot={tmp_path / 'areal'}"]
        + [f"train_dataset.path={data}"],
        dotenv=None,
        placeholders=True,
    )
    monkeypatch.setattr(cli_args, "save_config", lambda *a, **k: None)
    monkeypatch.delenv("SAO_REHEARSAL", raising=False)
    T._start_run(cfg, str(run))
    m = read_manifest(run)
    assert m["backend"] == "areal" and m["package"]["commit"] == git("rev-parse", "HEAD")
    assert m["versions"]["areal"] == importlib.metadata.version("areal")
    assert m["data"]["train"]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    src = json.loads((run / "config.json").read_text())["critic_source"]
    assert m["data"]["critic_init"] == {"path": src["path"], "sha256": src["sha256"]}
    if m["versions"]["vllm"] is None:  # vLLM lives in its own environment here, or nowhere: the note says which
        assert "not installed" in m["notes"]["vllm"]
    # a start in a folder that holds steps (AReaL's recover) is a resume from its last step
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    T._start_run(cfg, str(run))
    assert [r["step"] for r in read_manifest(run)["resumes"]] == [2]


def _cell_texts(page: str, table_id: str) -> list[list[str]]:
    t = re.search(rf'<table[^>]*id="{table_id}".*?</table>', page, flags=re.S).group(0)
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", t, flags=re.S)
    return [
        [
            html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r, flags=re.S)
        ]
        for r in rows
    ]


def test_report_shows_manifests_and_names_where_they_differ(tmp_path):
    "Report: a row per run (`no manifest` for an older run), and the one field two runs' manifests differ in."
    from sao_repro import report as R
    from sao_repro.report.bench import fabricate_runs

    runs = fabricate_runs(tmp_path / "runs", 3, steps=8, settings=["sao", "grpo"])  # sao/seed0, grpo/seed0, sao/seed1
    a, b = runs / "mini" / "sao" / "seed0", runs / "mini" / "grpo" / "seed0"
    write_manifest(a, "mini", {"warm_start": a / "config.json"})
    m = write_manifest(b, "mini", {"warm_start": a / "config.json"})
    m["versions"]["torch"] = "2.12.0"  # as if run with another torch
    (b / MANIFEST_FILE).write_text(json.dumps(m))
    diff = manifest_differences({r: read_manifest(runs / r) for r in ("mini/sao/seed0", "mini/grpo/seed0")})
    assert diff.startswith("All 2 runs share one manifest except: torch ") and "2.12.0 (mini/grpo/seed0)" in diff
    assert diff.count(" vs ") == 1  # nothing else differs
    out = tmp_path / "out"
    assert R.report_main(["--runs", str(runs), "--out", str(out), "--format", "html", "--engine", "nbconvert"]) == 0
    page = (out / "math_hard_report.html").read_text()
    rows = _cell_texts(page, "manifest-table")
    head, body = rows[0], {r[0]: dict(zip(rows[0], r)) for r in rows[1:]}
    assert head == ["run", "commit", "versions", "hardware", "data", "resumes"]
    assert body["mini/sao/seed1"]["commit"] == "no manifest"
    assert body["mini/sao/seed0"]["commit"].startswith(git("rev-parse", "HEAD")[:12])
    assert "torch 2.12.0" in body["mini/grpo/seed0"]["versions"]
    sha = hashlib.sha256((a / "config.json").read_bytes()).hexdigest()[:12]
    assert body["mini/sao/seed0"]["data"] == f"warm_start {sha}"
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    torch_v = importlib.metadata.version("torch")
    assert (
        "All 2 runs with a manifest share one manifest except: "
        f"torch 2.12.0 (mini/grpo/seed0) vs {torch_v} (mini/sao/seed0)." in text
    )  # the one field that differs, and nothing else
    assert "No manifest (made before runs recorded one): mini/sao/seed1." in text
