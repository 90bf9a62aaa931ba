"""The guards for AReaL 1.0.4's later-fixed bugs (sao_repro.areal.guards) against AReaL's own classes, each shown failing
with the guard switched off ($SAO_AREAL_GUARDS_OFF), and the launch's Ray tear-down ending only the Ray it started.
The rehearsal-level checks (the staleness bound after kill -9 + resume, the version test in float32, rollout ahead of
training) are in tests/test_rehearsal.py."""

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sao_repro.areal import guards as G
from sao_repro.areal.launch import start_ray_head, stop_ray_session
from sao_repro.areal.rehearse import missing_deps

needs_areal = pytest.mark.skipif(bool(missing_deps()), reason=f"AReaL's CPU dependencies missing: {missing_deps()}")
ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- bf16 optimizer state (AReaL issue 1292)


@needs_areal
@pytest.mark.parametrize(
    "config", sorted(p.name for p in (ROOT / "configs").glob("phase2_hard_*.yaml") if p.name != "phase2_hard_base.yaml")
)
def test_cluster_configs_keep_optimizer_state_in_float32(config):
    from sao_repro.areal.config import load_sao_config

    cfg = load_sao_config(ROOT / "configs" / config, placeholders=True, dotenv=None)
    for eng in (cfg.actor, cfg.critic):
        if eng is not None:
            assert eng.dtype == "bfloat16" and eng.optimizer_dtype == "float32", (
                config,
                eng.dtype,
                eng.optimizer_dtype,
            )


@needs_areal
def test_bf16_optimizer_state_is_refused_naming_the_key(monkeypatch):
    from sao_repro.areal.config import load_sao_config

    args = (ROOT / "configs" / "phase2_hard_sao.yaml", ["actor.optimizer_dtype=bfloat16"])
    with pytest.raises(
        ValueError, match=r"actor.optimizer_dtype=bfloat16 with actor.dtype=bfloat16.*set actor.optimizer_dtype=float32"
    ):
        load_sao_config(*args, placeholders=True, dotenv=None)
    monkeypatch.setenv(G.OFF_ENV, "optimizer_dtype")  # the guard off: the combination goes through to AReaL
    assert load_sao_config(*args, placeholders=True, dotenv=None).actor.optimizer_dtype == "bfloat16"


@needs_areal
def test_launch_dry_run_refuses_bf16_optimizer_state(capsys):
    from sao_repro.areal.launch import launch_main

    rc = launch_main(
        [
            str(ROOT / "configs" / "phase2_hard_sao.yaml"),
            "critic.optimizer_dtype=bf16",
            "--dry-run",
            "--dotenv",
            os.devnull,
        ]
    )
    assert rc == 2, capsys.readouterr()
    assert "critic.optimizer_dtype=bfloat16" in capsys.readouterr().err


# ---------------------------------------------------------------- version attribution (AReaL PR 1569)


def _vllm_answer(tokens, reason):
    return {
        "choices": [
            {
                "finish_reason": reason,
                "logprobs": {"tokens": [f"token_id:{t}" for t in tokens], "token_logprobs": [-1.0] * len(tokens)},
            }
        ]
    }


def _generate_across_an_update(monkeypatch):
    """AReaL's own RemoteInfEngine.agenerate against a fake vLLM: a weight update (pause: the request returns `abort`
    with 3 tokens; the version moves to 1) lands during the first HTTP round trip; the resubmitted request finishes."""
    import areal.infra.remote_inf_engine as rie
    from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
    from areal.api.io_struct import ModelRequest
    from areal.engine.vllm_remote import RemotevLLMEngine

    eng = RemotevLLMEngine(InferenceEngineConfig(experiment_name="t", trial_name="t"))
    G.pin_served_version(eng._engine)  # what the trainer does (a no-op with the guard off)
    inner = eng._engine
    inner.addresses = ["127.0.0.1:1"]
    inner.workflow_executor = type("Exec", (), {"is_paused": staticmethod(lambda: False)})()
    answers = [([11, 12, 13], "abort"), ([14, 15], "stop")]

    async def request(**kw):
        tokens, reason = answers.pop(0)
        if reason == "abort":
            inner.set_version(1)  # pause, weights updated, version set: all before this response is read
        return _vllm_answer(tokens, reason)

    async def session():
        return None

    monkeypatch.setattr(rie, "arequest_with_retry", request)
    monkeypatch.setattr(rie.workflow_context, "get_aiohttp_session", session)
    req = ModelRequest(input_ids=[1, 2, 3], gconfig=GenerationHyperparameters(max_new_tokens=5))
    return asyncio.run(eng.agenerate(req)).output_versions


@needs_areal
def test_each_segment_carries_the_version_that_served_it(monkeypatch):
    assert G.areal_has_fix("version") is False  # PyPI's 1.0.4 reads the version twice: the guard acts
    assert _generate_across_an_update(monkeypatch) == [0, 0, 0, 1, 1]


@needs_areal
def test_without_the_version_guard_old_tokens_carry_the_new_version(monkeypatch):
    monkeypatch.setenv(G.OFF_ENV, "version")
    assert _generate_across_an_update(monkeypatch) == [1, 1, 1, 1, 1]  # AReaL 1.0.4's labels: version 0's tokens as 1


@needs_areal
def test_cluster_engines_are_version_pinned():
    from areal.api.cli_args import InferenceEngineConfig
    from sao_repro.areal.vllm_server import VenvRemotevLLMEngine

    cfg = InferenceEngineConfig(experiment_name="t", trial_name="t")
    for cls in (G.GuardedRemotevLLMEngine, G.GuardedRemoteSGLangEngine, VenvRemotevLLMEngine):
        assert getattr(cls(cfg)._engine, "_sao_version_pinned", False), cls
    assert G.GuardedRemotevLLMEngine.__module__ == "sao_repro.areal.guards"  # importable by AReaL's workers


# ---------------------------------------------------------------- staleness after recover (AReaL issue 1388)


@needs_areal
@pytest.mark.parametrize("guard", [True, False])
def test_recovered_staleness_window_is_max_head_offpolicyness(monkeypatch, guard):
    """AReaL's StalenessManager as a fresh process has it after a recover to version 5 (accepted 0, the tag's v1.0.4):
    the guard brings the window back to (eta + 1) batches; without it the window is 5 batches too wide."""
    from areal.infra.staleness_manager import StalenessManager

    class Version:
        def get_version(self):
            return 5

    sm = StalenessManager(Version(), max_concurrent_rollouts=1000, consumer_batch_size=4, max_staleness=2)
    if guard:
        assert G.sync_staleness_after_recover(sm, 5)["acted"]
    assert sm.get_capacity() == (3 if guard else 8) * 4


# ---------------------------------------------------------------- Ray: stop only what was started


def _sleeper(tag, *more):
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", f"--session-dir=/tmp/ray/{tag}/logs", *more]
    )


def test_stop_ray_session_ends_only_that_sessions_processes():
    mine, other = _sleeper("session_2099-01-01_00-00-00_000001_1"), _sleeper("session_2099-01-01_00-00-00_000002_2")
    try:
        assert stop_ray_session("session_2099-01-01_00-00-00_000001_1", grace_s=5) == 1
        assert mine.wait(10) is not None
        time.sleep(0.5)
        assert other.poll() is None  # another Ray instance's process runs on
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()
    with pytest.raises(ValueError, match="not a Ray session"):
        stop_ray_session("")


def test_stop_ray_session_removes_rays_cluster_record_only_when_it_names_that_head(tmp_path):
    "As `ray stop` does: `ray_current_cluster` goes with the head it names (else `address='auto'` waits for a dead"
    "head); a record naming another head stays."
    record = tmp_path / "ray_current_cluster"
    for tag, head, kept in (
        ("session_2099-01-01_00-00-00_000003_3", "127.0.0.1:59993", False),  # the record names this head
        ("session_2099-01-01_00-00-00_000004_4", "127.0.0.1:59994", True),  # it names another one
    ):
        record.write_text("127.0.0.1:59993\n")
        p = _sleeper(tag, f"--gcs-address={head}")
        try:
            assert stop_ray_session(tag, grace_s=5, root=tmp_path) == 1 and p.wait(10) is not None
        finally:
            p.kill()
            p.wait()
        assert record.exists() == kept


def test_stop_ray_session_ends_a_renamed_process_by_the_session_file_it_holds_open(tmp_path):
    "Ray's agents and workers rename themselves (`ray::IDLE`: their command line names no session) but keep their logs"
    "open in the session's folder: that ends them too; a process holding a file of another session runs on."
    procs = []
    for tag in ("session_2099-01-01_00-00-00_000005_5", "session_2099-01-01_00-00-00_000006_6"):
        (tmp_path / tag / "logs").mkdir(parents=True)
        with open(tmp_path / tag / "logs" / "worker.out", "w") as log:
            procs.append(subprocess.Popen(["sleep", "120"], stdout=log))
    mine, other = procs
    try:
        assert stop_ray_session("session_2099-01-01_00-00-00_000005_5", grace_s=5, root=tmp_path) == 1
        assert mine.wait(10) is not None
        time.sleep(0.5)
        assert other.poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_start_ray_head_names_the_session_it_started(tmp_path):
    (tmp_path / "session_2099-01-01_00-00-00_000001_1").mkdir()

    def run(cmd, **kw):
        (tmp_path / "session_2099-01-01_00-00-00_000009_9").mkdir()
        return subprocess.CompletedProcess(cmd, 0)

    p, session = start_ray_head(["ray", "start", "--head"], run=run, root=tmp_path)
    assert p.returncode == 0 and session == "session_2099-01-01_00-00-00_000009_9"


def test_no_path_runs_a_bare_ray_stop():
    import re

    hits = [
        f"{p.relative_to(ROOT)}: {l.strip()}"
        for p in [*ROOT.glob("sao_repro/**/*.py"), *ROOT.glob("scripts/*")]
        if p.is_file()
        for l in p.read_text(errors="replace").splitlines()
        if re.search(r"""["']ray["'],\s*["']stop["']|^\s*ray stop\b""", l)
    ]
    assert not hits, hits
