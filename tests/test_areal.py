"""AReaL 1.0.4 backend: configs through AReaL's own loader, our GAE vs AReaL's `_compute_advantages`,
our DIS loss vs AReaL's `grpo_loss_fn`, the running-mean reward_norm across ranks, DIS statistics, engines.

Needs the areal==1.0.4 wheel and the packages it imports on a CPU (scripts/install_dev.sh installs both)."""

import copy
import glob
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import importlib.util

if importlib.util.find_spec("areal") is None:
    pytest.skip("areal==1.0.4 is not installed (bash scripts/install_dev.sh)", allow_module_level=True)

from areal.api.cli_args import PPOActorConfig, RejectionSamplingConfig
from areal.trainer.ppo.actor import PPOActor, grpo_loss_fn
from areal.utils.functional import apply_rejection_sampling
from areal.utils.stats_tracker import DistributedStatsTracker, ReduceType

from sao_repro.areal.algo import RunningMeanRewardNorm, log_dis_stats, areal_actor_keys
from sao_repro.areal.config import (
    SAOActorConfig,
    SAOConfig,
    SAOSection,
    load_sao_config,
    setting_mismatches,
    config_dict,
    config_yaml,
)
from sao_repro.areal.ppo_trainer import SAOPPOActor, SAOPPOCritic
from sao_repro.advantages import RunningMeanBaseline
from sao_repro.loss import policy_loss
from sao_repro.settings import get_setting, list_settings

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
SETTING_FILES = {
    "sao": "phase2_hard_sao.yaml",
    "grpo": "phase2_hard_grpo.yaml",
    "grpo_dis": "phase2_hard_grpo_dis.yaml",
    "running_mean": "phase2_hard_running_mean.yaml",
    "single_dis": "phase2_hard_grpo_dis_g1.yaml",
    "vapo": "phase2_hard_vapo.yaml",  # the paper's ablation arms
    "sao_k1": "phase2_hard_sao_k1.yaml",
    "sao_frozen": "phase2_hard_sao_frozen.yaml",
}


def load(name, *overrides):
    return load_sao_config(CONFIGS / name, list(overrides), dotenv=None, placeholders=True)


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("setting", list(SETTING_FILES))
def test_setting_config_loads_through_areal_and_matches_registry(setting):
    cfg = load(SETTING_FILES[setting])
    assert isinstance(cfg, SAOConfig)
    assert cfg.sao.setting == setting
    assert setting_mismatches(cfg) == []
    s = get_setting(setting)
    assert cfg.gconfig.n_samples == s.group_size
    assert (cfg.critic is not None) == s.critic
    rs = cfg.actor.rejection_sampling
    if s.band is None:
        assert rs is None and cfg.actor.use_decoupled_loss is False and cfg.actor.recompute_logprob is False
    else:
        assert (rs.level, rs.action, rs.metric, rs.lower, rs.upper) == ("token", "mask", "ratio", 0.3, 5.0)
        assert cfg.actor.use_decoupled_loss is True and cfg.actor.ppo_n_minibatches == 1
    # the AReaL schema pieces the issue names
    assert cfg.scheduler.type == "ray"
    assert cfg.rollout.backend.split(":")[0] in ("vllm", "sglang")
    assert cfg.rollout.max_head_offpolicyness >= 1
    assert cfg.actor.weight_update_mode == "disk"
    assert cfg.actor.path.endswith("Qwen3-4B-Instruct-2507")
    assert cfg.total_train_steps == 1000
    assert (cfg.cluster.n_nodes, cfg.cluster.n_gpus_per_node) == (3, 8)


def test_ablation_arm_configs_are_sao_less_one_component():
    """Each arm's cluster config resolves to phase2_hard_sao.yaml but for the keys of its one component (and its
    name); a run that drops the component is refused, naming the key."""
    from sao_repro.areal.launch import SETTING_CONFIGS

    assert set(list_settings()) <= set(SETTING_CONFIGS) and all(
        (CONFIGS / f).is_file() for f in SETTING_CONFIGS.values()
    )

    def flat(d, pre=""):
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{pre}{k}.") if isinstance(v, dict) and v else {f"{pre}{k}": v})
        return out

    sao = flat(config_dict(load("phase2_hard_sao.yaml")))
    named = {"sao.setting", "sao.run_dir", "trial_name"} | {k for k in sao if k.endswith(".trial_name")}
    named |= {k for k in sao if "tensorboard" in k or k.endswith(".path") and "runs" in str(sao[k])}
    for arm, want in {
        "vapo": {"actor.use_decoupled_loss": False, "actor.recompute_logprob": False, "actor.rejection_sampling": None},
        "sao_k1": {"sao.critic_k": 1},
        "sao_frozen": {"sao.critic_freeze": "attention"},
    }.items():
        cfg = flat(config_dict(load(SETTING_FILES[arm])))
        assert cfg["sao.setting"] == arm and cfg["trial_name"] == f"{arm}_s1"
        gone = object()  # a key one side lacks
        diff = {k: cfg.get(k) for k in set(cfg) | set(sao) if cfg.get(k, gone) != sao.get(k, gone) and k not in named}
        diff = {k: v for k, v in diff.items() if not k.startswith("actor.rejection_sampling.")}
        assert diff == want, (arm, diff)
    with pytest.raises(ValueError, match="sao.critic_freeze is 'none'; setting 'sao_frozen' needs 'attention'"):
        load("phase2_hard_sao_frozen.yaml", "sao.critic_freeze=none")
    with pytest.raises(ValueError, match="sao.critic_k is 2; setting 'sao_k1' needs 1"):
        load("phase2_hard_sao_k1.yaml", "sao.critic_k=2")
    with pytest.raises(ValueError, match="actor.rejection_sampling"):
        load(
            "phase2_hard_vapo.yaml",
            "actor.rejection_sampling={level:token,action:mask,metric:ratio,lower:0.3,upper:5.0}",
        )
    assert load("phase2_hard_sao_frozen.yaml").sao.effective_setting() == get_setting("sao_frozen")


def test_trajectories_per_step_equal_across_settings():
    cfgs = {s: load(f) for s, f in SETTING_FILES.items()}
    per_step = {s: c.train_dataset.batch_size * c.gconfig.n_samples for s, c in cfgs.items()}
    assert len(set(per_step.values())) == 1, per_step


def test_single_node_variant():
    cfg = load("phase2_hard_sao_1node.yaml")
    assert cfg.cluster.n_nodes == 1 and setting_mismatches(cfg) == []
    gpus = sum(
        int(b.split(":d")[1].split("t")[0]) * (int(b.split("t")[1]) if "t" in b.split(":")[1] else 1)
        for b in (cfg.rollout.backend, cfg.actor.backend, cfg.critic.backend)
    )
    assert gpus <= cfg.cluster.n_gpus_per_node


def test_paths_come_from_environment(monkeypatch):
    base = (CONFIGS / "phase2_hard_base.yaml").read_text()
    for var in ("SAO_WS", "MODEL_ROOT", "REWARD_ROOT"):
        assert "${oc.env:" + var + "}" in base
    monkeypatch.setenv("SAO_WS", "/ws")
    monkeypatch.setenv("MODEL_ROOT", "/models")
    monkeypatch.setenv("REWARD_ROOT", "/rw")
    cfg = load_sao_config(CONFIGS / "phase2_hard_sao.yaml", ["seed=7"], dotenv=None)
    assert cfg.actor.path == "/models/Qwen3-4B-Instruct-2507"
    assert cfg.sao.run_dir == "/ws/runs/areal/sao/seed7"
    assert cfg.trial_name == "sao_s7"


def test_unset_environment_is_a_clear_error(monkeypatch):
    for var in ("SAO_WS", "MODEL_ROOT", "REWARD_ROOT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="SAO_WS"):
        load_sao_config(CONFIGS / "phase2_hard_sao.yaml", [], dotenv=None)


def test_deviation_from_setting_names_key():
    with pytest.raises(ValueError, match="actor.rejection_sampling"):
        load("phase2_hard_grpo_dis.yaml", "actor.rejection_sampling=null")
    with pytest.raises(ValueError, match="sao.warmup_steps"):
        load("phase2_hard_sao.yaml", "sao.warmup_steps=0")
    # the 1.0.4 trap: decoupled loss without rejection_sampling drops the behave weight
    with pytest.raises(ValueError, match="use_decoupled_loss"):
        load("phase2_hard_grpo.yaml", "actor.use_decoupled_loss=true")
    cfg = load("phase2_hard_sao.yaml", "sao.warmup_steps=0", "sao.strict=false")
    assert cfg.sao.warmup_steps == 0


def test_resolved_yaml_round_trips_through_areal_loader(tmp_path):
    import yaml

    text = config_yaml(load("phase2_hard_sao.yaml"))
    d = yaml.safe_load(text)
    assert d["sao"]["setting"] == "sao" and d["actor"]["rejection_sampling"]["upper"] == 5.0
    assert "${" not in text
    f = tmp_path / "resolved.yaml"
    f.write_text(text)
    again = load_sao_config(f, [], dotenv=None, placeholders=True)
    assert config_yaml(again) == text


# ---------------------------------------------------------------- GAE vs AReaL's _compute_advantages


def sao_actor_config(**kw):
    "Our actor's config as the tests build it: a throwaway experiment on one FSDP rank, with `kw` on top."
    return SAOActorConfig(experiment_name="t", trial_name="t", backend="fsdp:d1", **kw)


def random_batch(seed, B=7, T=14, full_rows=(0,)):
    "AReaL-layout batch: prompt then answer, right-padded; rows in `full_rows` fill the padded width."
    g = torch.Generator().manual_seed(seed)
    attn = torch.zeros(B, T, dtype=torch.long)
    lmask = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        plen = int(torch.randint(1, 4, (1,), generator=g))
        seqlen = T if b in full_rows else int(torch.randint(plen + 1, T, (1,), generator=g))
        attn[b, :seqlen] = 1
        lmask[b, plen:seqlen] = 1
    return {
        "input_ids": torch.randint(0, 100, (B, T), generator=g),
        "attention_mask": attn,
        "loss_mask": lmask,
        "logprobs": -torch.rand(B, T, generator=g) * attn,
        "values": torch.randn(B, T, generator=g),
        "ref_logp": -torch.rand(B, T, generator=g),
        "rewards": torch.randn(B, generator=g),
    }


def actors(gamma, lam, kl_ctl):
    common = dict(experiment_name="t", trial_name="t", backend="fsdp:d1", kl_ctl=kl_ctl, discount=gamma, gae_lambda=lam)
    theirs = PPOActor(PPOActorConfig(**common), engine=None)
    ours = SAOPPOActor(
        SAOActorConfig(
            **common, sao=SAOSection(setting="sao", policy_lambda=str(lam), critic_lambda=lam, warmup_steps=10)
        ),
        engine=None,
    )
    return theirs, ours


@pytest.mark.parametrize(
    "seed,gamma,lam,kl_ctl", [(0, 1.0, 1.0, 0.0), (1, 0.99, 0.95, 0.0), (2, 1.0, 0.9, 0.1), (3, 0.97, 0.8, 0.05)]
)
def test_gae_equals_areal_compute_advantages_apart_from_the_fix(seed, gamma, lam, kl_ctl):
    data = random_batch(seed)
    theirs, ours = actors(gamma, lam, kl_ctl)
    a = theirs._compute_advantages(copy.deepcopy(data))
    o = ours._compute_advantages(copy.deepcopy(data))
    m = o["loss_mask"].bool()
    assert torch.equal(a["loss_mask"], o["loss_mask"])
    torch.testing.assert_close(o["tot_rewards"], a["tot_rewards"])
    torch.testing.assert_close(o["logprobs"], a["logprobs"])
    rest = torch.ones(len(m), dtype=torch.bool)
    rest[0] = False  # row 0 fills the padded width: the documented fix
    mm = m & rest[:, None]
    torch.testing.assert_close(o["advantages"][mm], a["advantages"][mm], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(o["returns"][mm], a["returns"][mm], rtol=1e-5, atol=1e-5)
    # with the untrained last value zeroed, AReaL agrees on the full row too: the fix is exactly that bootstrap
    d0 = copy.deepcopy(data)
    d0["values"][0, -1] = 0.0
    a0 = theirs._compute_advantages(d0)
    torch.testing.assert_close(o["advantages"][m], a0["advantages"][m], rtol=1e-5, atol=1e-5)


def test_areal_leak_bootstraps_from_the_untrained_last_position():
    "AReaL 1.0.4: the row that fills the padded width reads values[:, T-1]; ours ignores it."
    data = random_batch(5, full_rows=(0,))
    theirs, ours = actors(1.0, 1.0, 0.0)
    T = data["input_ids"].shape[1]
    assert int(data["attention_mask"][0].sum()) == T  # row 0 fills the width, e.g. it is merely the longest
    rolled = torch.roll(data["loss_mask"].float(), -1, dims=-1)
    assert rolled[0, T - 1] == 0  # that position is never trained (not on the loss mask)
    bumped = copy.deepcopy(data)
    bumped["values"][0, T - 1] += 10.0
    m = rolled.bool()
    a, a2 = theirs._compute_advantages(copy.deepcopy(data)), theirs._compute_advantages(copy.deepcopy(bumped))
    o, o2 = ours._compute_advantages(copy.deepcopy(data)), ours._compute_advantages(copy.deepcopy(bumped))
    leak = a2["advantages"][0][m[0]] - a["advantages"][0][m[0]]
    torch.testing.assert_close(leak, torch.full_like(leak, 10.0))  # every action of the row shifts by the junk value
    torch.testing.assert_close(a2["advantages"][1:][m[1:]], a["advantages"][1:][m[1:]])  # other rows unaffected
    torch.testing.assert_close(o2["advantages"], o["advantages"])  # ours: no leak
    # with gamma = lambda = 1 ours is the Monte-Carlo return minus the value on every action
    r = data["rewards"][0]
    torch.testing.assert_close(o["advantages"][0][m[0]], r - data["values"][0][m[0]])


def test_sao_lambdas_adaptive_policy_montecarlo_critic():
    data = random_batch(9, full_rows=())
    data.pop("ref_logp")
    cfg = sao_actor_config(
        kl_ctl=0.0,
        sao=SAOSection(setting="sao", policy_lambda="adaptive", warmup_steps=10),
    )
    o = SAOPPOActor(cfg, engine=None)._compute_advantages(copy.deepcopy(data))
    m = o["loss_mask"].bool()
    from sao_repro.gae import gae_reference, adaptive_lambda

    lam = adaptive_lambda(m.sum(1), 1.5)
    ref_adv, _ = gae_reference(o["tot_rewards"], data["values"], m, 1.0, lam)
    _, ref_ret = gae_reference(o["tot_rewards"], data["values"], m, 1.0, 1.0)
    torch.testing.assert_close(o["advantages"], ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(o["returns"], ref_ret, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- DIS loss vs AReaL's grpo_loss_fn


def loss_inputs(seed, B=5, T=9):
    g = torch.Generator().manual_seed(seed)
    behav = -torch.rand(B, T, generator=g) * 2
    prox = behav + torch.randn(B, T, generator=g) * 0.9  # wide spread: some ratios leave [0.3, 5]
    mask = torch.rand(B, T, generator=g) > 0.25
    adv = torch.randn(B, T, generator=g)
    return behav, prox, mask, adv


def areal_loss(logp, behav, prox, mask, adv, rs, decoupled):
    data = {"logprobs": behav, "advantages": adv, "loss_mask": mask, "prox_logp": prox}
    return grpo_loss_fn(
        logp,
        torch.zeros_like(logp),
        data,
        eps_clip=0.2,
        eps_clip_higher=None,
        c_clip=None,
        rejection_sampling=rs,
        use_decoupled_loss=decoupled,
    )


RS = RejectionSamplingConfig(level="token", action="mask", metric="ratio", lower=0.3, upper=5.0)


@pytest.mark.parametrize("seed", range(4))
def test_dis_loss_equals_areal_grpo_loss_fn(seed):
    behav, prox, mask, adv = loss_inputs(seed)
    # decoupled form, a stale pi_theta (several minibatches): matches AReaL value and gradient
    logp_a = (prox + 0.05 * torch.randn_like(prox)).requires_grad_(True)
    logp_o = logp_a.detach().clone().requires_grad_(True)
    la = areal_loss(logp_a, behav, prox, mask, adv, RS, True)
    lo, metrics = policy_loss(logp_o, behav, adv, mask, band=(0.3, 5.0), form="decoupled", prox_logp=prox)
    la.backward()
    lo.backward()
    torch.testing.assert_close(lo, la)
    torch.testing.assert_close(logp_o.grad, logp_a.grad)
    ratio = torch.exp(prox - behav)
    dropped = mask & ((ratio < 0.3) | (ratio > 5.0))
    assert dropped.any(), "the test data must exercise the band"
    assert torch.all(logp_a.grad[dropped] == 0) and torch.all(logp_o.grad[dropped] == 0)
    assert torch.all(logp_o.grad[~mask] == 0)
    assert metrics["dis/kept_frac"] == pytest.approx(1 - float(dropped.sum()) / float(mask.sum()))


@pytest.mark.parametrize("seed", range(3))
def test_one_minibatch_decoupled_gradient_is_direct_dis(seed):
    "ppo_n_minibatches: 1 -> pi_prox = pi_theta at the gradient: AReaL's decoupled loss = the paper's direct DIS."
    behav, prox, mask, adv = loss_inputs(seed)
    logp_a = prox.clone().requires_grad_(True)
    logp_o = prox.clone().requires_grad_(True)
    areal_loss(logp_a, behav, prox, mask, adv, RS, True).backward()
    lo, _ = policy_loss(logp_o, behav, adv, mask, band=(0.3, 5.0), form="direct")
    lo.backward()
    torch.testing.assert_close(logp_o.grad, logp_a.grad)


def test_no_dis_is_ppo_ratio_against_behave():
    "grpo / running_mean: use_decoupled_loss false, rejection_sampling null = policy_loss(band=None, form='direct')."
    behav, prox, mask, adv = loss_inputs(11)
    logp_a = (behav + 0.3 * torch.randn_like(behav)).requires_grad_(True)
    logp_o = logp_a.detach().clone().requires_grad_(True)
    la = areal_loss(logp_a, behav, behav, mask, adv, None, False)  # AReaL: prox_logp = behave logp
    lo, _ = policy_loss(logp_o, behav, adv, mask, band=None, form="direct")
    la.backward()
    lo.backward()
    torch.testing.assert_close(lo, la)
    torch.testing.assert_close(logp_o.grad, logp_a.grad)


def test_decoupled_without_rejection_sampling_drops_behave_weight():
    "The 1.0.4 trap the configs avoid: with rejection_sampling null the stale-policy weight is gone."
    behav, prox, mask, adv = loss_inputs(12)
    logp = prox.clone()
    trap = areal_loss(logp, behav, prox, mask, adv, None, True)
    on_policy_ppo = areal_loss(logp, prox, prox, mask, adv, None, True)  # as if behave == prox
    torch.testing.assert_close(trap, on_policy_ppo)  # behave log-probs play no role at all
    assert not torch.allclose(trap, areal_loss(logp, behav, prox, mask, adv, RS, True))


# ---------------------------------------------------------------- DIS statistics


def test_dis_stats_token_weighted_vs_areal_micro_batch_mean():
    tr = DistributedStatsTracker()
    behav = torch.zeros(1, 8)
    mb1 = (torch.tensor([[math.log(9.0)] + [0.0] * 7]), torch.tensor([[1] + [0] * 7]))  # 1 token, dropped
    mb2 = (torch.zeros(1, 8), torch.ones(1, 8, dtype=torch.long))  # 8 tokens, all kept
    fractions = []
    for prox, mask in (mb1, mb2):
        log_dis_stats(tr, prox, behav, mask, (0.3, 5.0), ReduceType.AVG)
        fractions.append(apply_rejection_sampling(prox, behav, mask, None, RS).filtered_fraction)
    out = tr.export()
    assert out["dis/masked_above_frac"] == pytest.approx(1 / 9)
    assert out["dis/kept_frac"] == pytest.approx(8 / 9)
    assert out["dis/masked_below_frac"] == 0
    assert sum(fractions) / len(fractions) == pytest.approx(0.5)  # what rs_filtered_fraction averages to


def test_actor_logs_dis_under_root_names_inside_areal_scope():
    from areal.utils import stats_tracker

    stats_tracker.export()  # reset
    cfg = sao_actor_config(
        kl_ctl=0.0,
        use_decoupled_loss=True,
        rejection_sampling=RS,
        sao=SAOSection(setting="single_dis"),
    )
    actor = SAOPPOActor(cfg, engine=None)
    called = []
    orig = PPOActor._ppo_update
    PPOActor._ppo_update = lambda self, data: called.append(True)
    try:
        with stats_tracker.scope("ppo_actor"):
            actor._ppo_update(
                {
                    "prox_logp": torch.tensor([[math.log(0.1), 0.0]]),
                    "logprobs": torch.zeros(1, 2),
                    "loss_mask": torch.ones(1, 2),
                }
            )
    finally:
        PPOActor._ppo_update = orig
    out = stats_tracker.export()
    assert called and out["dis/masked_below_frac"] == pytest.approx(0.5)


def test_actor_keeps_samples_that_match_its_dis_stats(tmp_path):
    "The actor keeps rows of its batch in samples.jsonl.gz with the DIS mask its `dis/` metrics count (and in warmup)."
    from areal.utils import stats_tracker

    from sao_repro.samples import masked_tokens, read_samples

    data = obs_tail_batch()
    data["versions"] = torch.where(
        data["loss_mask"].bool(), torch.tensor([[4], [3], [4]]), torch.full((3, 9), -1, dtype=torch.long)
    )
    data["prox_logp"] = torch.roll(data["logprobs"], -1, -1).clone()
    data["prox_logp"][0, 2] += math.log(9.0)  # ratio 9: above the band
    data["prox_logp"][2, 4] -= math.log(9.0)  # ratio 1/9: below it
    sao = SAOSection(setting="single_dis", run_dir=str(tmp_path), samples_per_step=3, samples_every=1)
    cfg = sao_actor_config(
        kl_ctl=0.0,
        use_decoupled_loss=True,
        recompute_logprob=True,
        rejection_sampling=RS,
        sao=sao,
    )
    tok = SimpleNamespace(decode=lambda ids: "".join(f"<{i}>" for i in ids))
    actor = SAOPPOActor(cfg, SimpleNamespace(get_version=lambda: 4, tokenizer=tok))
    stats_tracker.export()  # reset
    d = actor._compute_advantages(copy.deepcopy(data))
    orig = PPOActor._ppo_update
    PPOActor._ppo_update = lambda self, data: None
    try:
        actor._ppo_update(d)
    finally:
        PPOActor._ppo_update = orig
    out = stats_tracker.export()
    recs = read_samples(tmp_path)
    assert [(r["step"], r["row"], r["trainer_version"]) for r in recs] == [(5, 0, 4), (5, 1, 4), (5, 2, 4)]
    assert [r["reward"] for r in recs] == [1.0, -0.5, 2.0] and recs[1]["verdict"] == "wrong"
    assert recs[0]["tokens"]["id"] == data["input_ids"][0, 2:7].tolist()  # 3 actions, then the tool's 2 tokens
    assert recs[0]["tokens"]["loss_mask"] == [True, True, True, False, False]
    assert recs[0]["response"] == "".join(f"<{i}>" for i in recs[0]["tokens"]["id"])
    assert recs[2]["tokens"]["version"][:2] == [4, 4] and recs[1]["tokens"]["version"][0] == 3
    gen = sum(sum(r["tokens"]["loss_mask"]) for r in recs)
    masked = sum(sum(masked_tokens(r)) for r in recs)
    assert masked == 2 and masked / gen == pytest.approx(1 - out["dis/kept_frac"])
    assert recs[0]["tokens"]["logp"][1] == pytest.approx(float(data["prox_logp"][0, 2]), abs=1e-6)
    assert recs[0]["tokens"]["behav_logp"][1] == pytest.approx(float(data["logprobs"][0, 3]), abs=1e-6)
    # the critic-only warmup keeps its rows too, without a DIS mask
    warm = sao_actor_config(
        kl_ctl=0.0,
        sao=SAOSection(setting="sao", run_dir=str(tmp_path / "w"), warmup_steps=10, samples_every=1),
    )
    actor = SAOPPOActor(warm, SimpleNamespace(get_version=lambda: 0))
    d = actor._compute_advantages({k: v for k, v in copy.deepcopy(data).items() if k != "prox_logp"})
    actor.ppo_update([d])
    recs = read_samples(tmp_path / "w")
    assert [(r["step"], r["row"]) for r in recs] == [(1, 0), (1, 1)]
    assert all(r["tokens"]["dis_kept"] is None and r["tokens"]["logp"] is None for r in recs)


# ---------------------------------------------------------------- running-mean baseline


def test_reward_norm_matches_running_mean_baseline_single_rank():
    norm, ref = RunningMeanRewardNorm(), RunningMeanBaseline()
    for batch in ([1.0, 0.0, 1.0], [0.0], [1.0, 1.0]):
        x = torch.tensor(batch)
        torch.testing.assert_close(norm(x), x - ref.mean)
        ref.update(x)
    assert norm.mean == pytest.approx(ref.mean)


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    "Both modes of RunningMeanRewardNorm on 2 gloo ranks (one spawn; the worker module is light)."
    import torch.multiprocessing as mp
    from _areal_dist_worker import rank_worker

    d = tmp_path_factory.mktemp("dist")
    mp.spawn(rank_worker, args=(2, str(d / "init"), str(d / "out")), nprocs=2, join=True)
    return [torch.load(f"{d / 'out'}.{r}") for r in (0, 1)]


@pytest.mark.parametrize("mode", ["exact", "ema"])
def test_reward_norm_consistent_across_data_parallel_ranks(two_rank_results, mode):
    r0, r1 = (r[mode] for r in two_rank_results)
    assert r0["state"] == r1["state"]  # same baseline on every rank
    ref = RunningMeanBaseline(mode=mode).update(torch.tensor([1.0, 1.0, 1.0, 0.0]))  # step 1 on both ranks: 4 rewards
    assert r0["outs"][0] == [1.0, 1.0, 1.0] and r1["outs"][0] == [0.0]  # first step: baseline 0
    assert r0["outs"][1] == pytest.approx([0.0 - ref.mean])
    assert r1["outs"][1] == pytest.approx([1.0 - ref.mean] * 2)
    ref.update(torch.tensor([0.0, 1.0, 1.0]))
    assert r0["state"]["count"] == 7
    assert RunningMeanRewardNorm(mode=mode).load_state_dict(r0["state"]).mean == pytest.approx(ref.mean)


def test_running_mean_state_saved_and_restored_by_engine(tmp_path):
    from sao_repro.areal.engine import make_engine_class

    class FakeBase:
        def __init__(self, config):
            self.config = config

        def save(self, meta):
            Path(meta.path, "weights").write_text("w")

        def load(self, meta):
            assert Path(meta.path, "weights").exists()

        def get_version(self):
            return 0

    E = make_engine_class(FakeBase, "actor", "SAOFakeActor")
    cfg = sao_actor_config(sao=SAOSection(setting="running_mean"))
    e = E(cfg)
    e.actor.reward_norm(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    e.save(SimpleNamespace(path=str(tmp_path)))
    e2 = E(cfg)
    assert e2.actor.reward_norm.mean == 0.0
    e2.load(SimpleNamespace(path=str(tmp_path)))
    assert e2.actor.reward_norm.mean == pytest.approx(0.5)
    assert e2.actor.reward_norm.baseline.count == 4


# ---------------------------------------------------------------- warmup, critic passes, trainer wiring


def test_actor_skips_policy_update_during_warmup():
    cfg = sao_actor_config(
        sao=SAOSection(setting="sao", policy_lambda="adaptive", warmup_steps=10),
    )
    version = {"v": 0}
    actor = SAOPPOActor(cfg, SimpleNamespace(get_version=lambda: version["v"]))
    calls = []
    orig = PPOActor.ppo_update
    PPOActor.ppo_update = lambda self, data: calls.append(version["v"])
    try:
        for v in range(12):
            version["v"] = v
            actor.ppo_update([{}])
    finally:
        PPOActor.ppo_update = orig
    assert calls == [10, 11]


def test_critic_runs_k_passes():
    from areal.trainer.ppo.critic import PPOCritic
    from sao_repro.areal.config import SAOCriticConfig

    cfg = SAOCriticConfig(
        experiment_name="t",
        trial_name="t",
        backend="fsdp:d1",
        sao=SAOSection(setting="sao", critic_k=3, policy_lambda="adaptive", warmup_steps=10),
    )
    critic = SAOPPOCritic(cfg, None)
    calls = []
    orig = PPOCritic.ppo_update
    PPOCritic.ppo_update = lambda self, data: calls.append(1)
    try:
        critic.ppo_update(
            [{"values": torch.zeros(1, 3), "returns": torch.tensor([[1.0, 0.0, 1.0]]), "loss_mask": torch.ones(1, 3)}]
        )
    finally:
        PPOCritic.ppo_update = orig
    assert len(calls) == 3


def test_trainer_builds_sao_engines_for_actor_and_critic_only(monkeypatch):
    import sao_repro.areal.ppo_trainer as T

    cfg = load("phase2_hard_sao.yaml")
    built = []

    class FakeEngine:
        @classmethod
        def as_controller(cls, config, scheduler):
            built.append(config)
            return SimpleNamespace(create_process_group=lambda parallel_strategy=None: None)

    monkeypatch.setattr(T, "_engine_for", lambda role, alloc: FakeEngine)
    monkeypatch.setattr(T, "is_single_controller", lambda: True)
    monkeypatch.setattr(T.PPOTrainer, "_create_train_engine", lambda self, c, a: "areal's own")
    self = T.SAOPPOTrainer.__new__(T.SAOPPOTrainer)  # no AReaL start-up: only the two factory methods run
    self.config, self.scheduler = cfg, None
    alloc = SimpleNamespace(backend="fsdp", parallel=None)
    T.SAOPPOTrainer._create_train_engine(self, cfg.actor, alloc)
    T.SAOPPOTrainer._create_critic(self, cfg.critic, alloc)
    assert [type(c).__name__ for c in built] == ["SAOActorConfig", "SAOCriticConfig"]
    assert built[0].sao.setting == "sao" and built[0].rejection_sampling.upper == 5.0
    ref_cfg = copy.deepcopy(cfg.actor)
    assert T.SAOPPOTrainer._create_train_engine(self, ref_cfg, alloc) == "areal's own"


def test_engine_classes_resolve_by_dotted_path_names():
    import sao_repro.areal.engine as E

    assert E.engine_class_name("actor", "fsdp") == "SAOFSDPPPOActor"
    assert set(E.ENGINE_BASES) == {"SAOFSDPPPOActor", "SAOFSDPPPOCritic", "SAOMegatronPPOActor", "SAOMegatronPPOCritic"}
    with pytest.raises(AttributeError):
        _ = E.NoSuchEngine


def test_actor_keys_table_covers_all_settings():
    for s in list_settings():
        keys = areal_actor_keys(get_setting(s))
        assert keys["use_decoupled_loss"] == (get_setting(s).band is not None)


# ---------------------------------------------------------------- the training entry without a GPU


@pytest.mark.slow
def test_train_module_help_and_print_config():
    env = dict(os.environ)
    r = subprocess.run(
        [sys.executable, "-m", "sao_repro.areal.train", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0 and "--config" in r.stdout
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sao_repro.areal.train",
            "--config",
            "configs/phase2_hard_grpo.yaml",
            "--print-config",
            "--dotenv",
            "none",
            "seed=4",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    import yaml

    d = yaml.safe_load(r.stdout)
    assert d["trial_name"] == "grpo_s4" and d["sao"]["setting"] == "grpo"


# ---------------------------------------------------------------- patches


def test_patches_apply_to_installed_wheel_or_none_needed():
    patches = sorted(glob.glob(str(ROOT / "patches" / "*.patch")))
    readme = ROOT / "patches" / "README.md"
    assert readme.is_file(), "patches/README.md says which AReaL changes need a patch and why"
    if not patches:
        assert "none" in readme.read_text().lower()
        return
    import areal

    site = Path(areal.__file__).resolve().parent.parent
    for p in patches:
        assert Path(p).name in readme.read_text(), f"{p} is not explained in patches/README.md"
        r = subprocess.run(["git", "apply", "--check", "--directory", ".", p], cwd=site, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_math_dataset_and_reward_env_for_the_workers(tmp_path, monkeypatch):
    import json
    from sao_repro.areal.train import load_math_dataset, _export_reward_env, PROMPT_SUFFIX

    f = tmp_path / "train.jsonl"
    f.write_text(json.dumps({"id": "a", "question": "What is 1+1?", "answer": "so \\boxed{2}\n#### 2"}) + "\n")
    ds = load_math_dataset(str(f))
    assert ds[0]["messages"] == [{"role": "user", "content": "What is 1+1?" + PROMPT_SUFFIX}]
    assert ds[0]["answer"].endswith("#### 2")  # math_reward_fn reads the gold answer from the row
    with pytest.raises(FileNotFoundError, match="prepare-math"):
        load_math_dataset(str(tmp_path / "missing.jsonl"))
    for k in ("SAO_REWARD_BACKEND", "SAO_REWARD_WORKERS", "SAO_REWARD_TIMEOUT_S"):
        monkeypatch.setenv(k, "x")  # recorded, so the values set below are undone after the test
    cfg = load("phase2_hard_sao.yaml", "reward.workers=7")
    env = _export_reward_env(cfg)
    assert env == {"SAO_REWARD_BACKEND": "ray", "SAO_REWARD_WORKERS": "7", "SAO_REWARD_TIMEOUT_S": "5.0"}
    assert all(spec.env_vars["SAO_REWARD_WORKERS"] == "7" for spec in cfg.rollout.scheduling_spec)
    assert cfg.sao.reward_fn == "sao_repro.reward.math_reward_fn"


def test_critic_logs_what_the_health_flags_read():
    "critic/grad_clip (the optimizer's gradient_clipping) and critic/returns_std, 0 for a degenerate batch."
    from areal.utils import stats_tracker
    from sao_repro.areal.engine import critic_health

    cfg = SimpleNamespace(optimizer=SimpleNamespace(gradient_clipping=1.0))
    d = [{"returns": torch.tensor([[1.0, 0.0, 1.0]]), "loss_mask": torch.ones(1, 3)}]
    h = critic_health(d, cfg)
    assert (
        h["critic/grad_clip"] == 1.0 and abs(h["critic/returns_std"] - (2 / 9) ** 0.5) < 1e-6
    )  # population std of 1, 0, 1
    same = [{"returns": torch.ones(1, 3), "loss_mask": torch.ones(1, 3)}]
    assert critic_health(same, cfg)["critic/returns_std"] == 0.0
    stats_tracker.export()  # drop what earlier tests left
    from areal.trainer.ppo.critic import PPOCritic
    from sao_repro.areal.config import SAOCriticConfig
    from areal.api.cli_args import OptimizerConfig

    critic = SAOPPOCritic(
        SAOCriticConfig(
            experiment_name="t",
            trial_name="t",
            backend="fsdp:d1",
            optimizer=OptimizerConfig(gradient_clipping=10.0),
            sao=SAOSection(setting="sao", policy_lambda="adaptive", warmup_steps=10),
        ),
        None,
    )
    orig = PPOCritic.ppo_update
    PPOCritic.ppo_update = lambda self, data: None
    try:
        critic.ppo_update([{**same[0], "values": torch.zeros(1, 3)}])
    finally:
        PPOCritic.ppo_update = orig
    out = stats_tracker.export()
    assert out["critic/returns_std"] == 0.0 and "critic/explained_var" not in out and out["critic/grad_clip"] == 10.0


def test_adv_whiten_whitens_advantages_not_returns():
    "sao.adv_whiten: advantages mean 0 / std 1 over the action tokens; returns (the critic's targets) identical."
    data = random_batch(5)
    outs = {}
    for w in (False, True):
        ours = SAOPPOActor(
            sao_actor_config(
                kl_ctl=0.0,
                sao=SAOSection(setting="sao", policy_lambda="adaptive", warmup_steps=10, adv_whiten=w, strict=False),
            ),
            engine=None,
        )
        outs[w] = ours._compute_advantages(copy.deepcopy(data))
    m = outs[True]["loss_mask"].bool()
    assert torch.equal(outs[True]["returns"], outs[False]["returns"])
    a = outs[True]["advantages"][m]
    assert abs(float(a.mean())) < 1e-5 and abs(float(a.var(unbiased=False)) - 1.0) < 1e-4
    assert not torch.allclose(outs[True]["advantages"][m], outs[False]["advantages"][m])
    with pytest.raises(ValueError, match="sao.adv_whiten"):
        SAOSection(adv_whiten="yes")


def test_critic_engine_freezes_attention_before_its_optimizer(monkeypatch):
    "The SAO critic engine's _create_optimizer freezes the tiny HF model's self_attn.* first: AdamW then never holds their state."
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from sao_repro.areal.engine import make_engine_class

    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )

    class Base:
        def __init__(self, config):
            self.config = config

        def _create_optimizer(self, ft_spec):
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)

    cls = make_engine_class(Base, "critic", "SAOTestCritic")
    eng = object.__new__(cls)
    eng.config, eng.model = (
        SimpleNamespace(sao=SAOSection(setting="sao", critic_freeze="attention", strict=False)),
        model,
    )
    cls._create_optimizer(eng, None)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(".self_attn." in n for n in frozen) and len(frozen) == 7  # q, k, v (weight + bias), o
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(2):  # K = 2 updates
        eng.optimizer.zero_grad()
        model(torch.randint(0, 32, (2, 5))).logits.square().mean().backward()
        eng.optimizer.step()
    after = dict(model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in frozen)
    assert not torch.equal(before["model.layers.0.mlp.up_proj.weight"], after["model.layers.0.mlp.up_proj.weight"])
    assert not any(after[n] in eng.optimizer.state for n in frozen)
    bad = object.__new__(cls)
    bad.config, bad.model = eng.config, torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="modules seen: 0"):
        cls._create_optimizer(bad, None)


def test_paper_reading_config_loads_and_matches_its_readings():
    "phase2_hard_sao_paper.yaml: setting sao with the paper-math band [0.7, 6.0] and frozen attention, strict."
    cfg = load("phase2_hard_sao_paper.yaml")
    assert cfg.sao.setting == "sao" and cfg.sao.strict and setting_mismatches(cfg) == []
    rs = cfg.actor.rejection_sampling
    assert (rs.level, rs.action, rs.metric, rs.lower, rs.upper) == ("token", "mask", "ratio", 0.7, 6.0)
    assert (cfg.sao.dis_band, cfg.sao.critic_freeze) == ("paper-math", "attention")
    e = cfg.sao.effective_setting()
    assert (e.band, e.dis_preset, e.critic_freeze) == ((0.7, 6.0), "paper-math", "attention")
    ref = load("phase2_hard_sao.yaml")
    assert ref.sao.effective_setting().dis_preset == "reference" and cfg.trial_name != ref.trial_name
    assert cfg.sao.run_dir != ref.sao.run_dir
    # the band must agree with the named preset, and the preset must be one of the named ones
    with pytest.raises(ValueError, match="actor.rejection_sampling"):
        load("phase2_hard_sao_paper.yaml", "actor.rejection_sampling.lower=0.3", "actor.rejection_sampling.upper=5.0")
    with pytest.raises(ValueError, match="reference, paper-math, paper-coding"):
        load("phase2_hard_sao_paper.yaml", "sao.dis_band=paper")
    cfg = load(
        "phase2_hard_sao.yaml",
        "sao.dis_band=paper-coding",
        "actor.rejection_sampling.lower=0.2",
        "actor.rejection_sampling.upper=4.0",
    )
    assert setting_mismatches(cfg) == [] and cfg.sao.effective_setting().band == (0.2, 4.0)
    with pytest.raises(ValueError, match="sao.critic_freeze"):
        load("phase2_hard_grpo_dis.yaml", "+sao.critic_freeze=attention")  # no critic to freeze


def _tiny_critic(seed, **kw):
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    torch.manual_seed(seed)
    c = dict(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
    )
    return Qwen2ForTokenClassification(Qwen2Config(**{**c, **kw}))


def test_critic_engine_warm_starts_from_an_areal_critic_checkpoint(tmp_path):
    "sao.critic_init: an AReaL critic folder is checked name by name and shape by shape, loaded before freezing, recorded."
    from areal.utils.save_load import get_state_dict_from_repo_id_or_path
    from sao_repro.areal.engine import critic_init_source, make_engine_class

    ck = tmp_path / "critic" / "epoch0epochstep7globalstep7"
    _tiny_critic(0).save_pretrained(ck)  # what AReaL's critic engine writes (model.save_pretrained, safetensors)

    class Base:  # AReaL's engine interface, without torch.distributed
        def __init__(self, config):
            self.config = config

        def _load_model_from_hf(self, path):
            self.model.load_state_dict(get_state_dict_from_repo_id_or_path(path))

        def _create_optimizer(self, ft_spec):
            self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-2)

    cls = make_engine_class(Base, "critic", "SAOTestCriticInit")

    def engine(model, path, freeze="none"):
        eng = object.__new__(cls)
        eng.config = SimpleNamespace(
            sao=SAOSection(setting="sao", critic_init=str(path), critic_freeze=freeze, strict=False)
        )
        eng.model = model
        return eng

    eng = engine(_tiny_critic(1), ck, "attention")
    cls._create_optimizer(eng, None)
    saved = _tiny_critic(0).state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in eng.model.state_dict().items())
    assert not eng.model.model.layers[0].self_attn.q_proj.weight.requires_grad  # frozen after the load
    src = critic_init_source(str(ck))
    assert src["path"] == str(ck.resolve()) and src["step"] == 7 and len(src["sha256"]) == 64
    assert src["files"] == ["model.safetensors"] and src["architecture"] == "Qwen2ForTokenClassification"
    # a critic of another shape: the error names the parameters that differ, nothing is loaded
    other = _tiny_critic(2, intermediate_size=48)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(
        ValueError,
        match=r"shapes differ .* model\.layers\.0\.mlp\.down_proj\.weight \(here \(16, 48\), there \(16, 32\)\)",
    ):
        cls._create_optimizer(engine(other, ck), None)
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())
    # across backends: a testbed run folder or checkpoint is refused with the reason; so is a policy checkpoint
    run = tmp_path / "runs" / "mini" / "sao" / "seed0"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"step": 3, "critic": None}, run / "checkpoints" / "step_3.pt")
    for p in (run, run / "checkpoints" / "step_3.pt"):
        with pytest.raises(ValueError, match="testbed .* cannot warm-start an AReaL critic"):
            cls._create_optimizer(engine(_tiny_critic(1), p), None)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).save_pretrained(tmp_path / "policy")
    with pytest.raises(ValueError, match="Qwen2ForCausalLM checkpoint, not a critic"):
        critic_init_source(str(tmp_path / "policy"))
    with pytest.raises(FileNotFoundError, match="no such folder"):
        critic_init_source(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="sao.critic_init"):  # a setting without a critic has nothing to warm-start
        load("phase2_hard_grpo.yaml", "sao.critic_init=/somewhere")


def test_config_json_records_the_band_preset_and_critic_source(tmp_path, monkeypatch):
    "Rank 0's config.json: the effective setting (resolved paper-math band, its preset, frozen attention) and the critic's source."
    import json
    import areal.api.cli_args as cli_args
    from sao_repro.areal import train as T

    ck = tmp_path / "ck" / "epoch1epochstep3globalstep12"
    _tiny_critic(0).save_pretrained(ck)
    run = tmp_path / "run"
    cfg = load(
        "phase2_hard_sao_paper.yaml",
        f"sao.run_dir={run}",
        f"sao.critic_init={ck}",
        f"cluster.fileroot={tmp_path / 'areal'}",
    )  # AReaL's log folders go there, not under the working folder
    monkeypatch.setattr(cli_args, "save_config", lambda *a, **k: None)  # AReaL's own copy goes under its fileroot
    T._start_run(cfg, str(run))
    c = json.loads((run / "config.json").read_text())
    spec = c["setting_spec"]
    assert (spec["dis_band"], spec["dis_preset"], spec["critic_freeze"]) == ([0.7, 6.0], "paper-math", "attention")
    src = c["critic_source"]
    assert src["path"] == str(ck.resolve()) and src["step"] == 12 and len(src["sha256"]) == 64
    import hashlib

    assert src["sha256"] == hashlib.sha256((ck / "model.safetensors").read_bytes()).hexdigest()


# ---------------------------------------------------------------- one reward placement, one GRPO, mismatch stats


def obs_tail_batch():
    """AReaL layout, width 9: row 0 = prompt 2 + actions 3 + a tool's output 2 (ends on observation tokens) + padding;
    row 1 = prompt 2 + actions 4 + padding; row 2 = prompt 1 + actions 2 + observation 1 + actions 2 + observation 3."""
    lmask = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 1, 1, 0, 0, 0]])
    attn = torch.tensor([[1] * 7 + [0] * 2, [1] * 6 + [0] * 3, [1] * 9])
    g = torch.Generator().manual_seed(3)
    return {
        "input_ids": torch.randint(0, 50, (3, 9), generator=g),
        "attention_mask": attn,
        "loss_mask": lmask,
        "logprobs": -torch.rand(3, 9, generator=g) * attn,
        "values": torch.randn(3, 9, generator=g),
        "rewards": torch.tensor([1.0, -0.5, 2.0]),
    }


def test_reward_on_the_last_action_as_the_testbed_for_rows_ending_on_observations():
    from sao_repro.advantages import get_advantage

    data = obs_tail_batch()
    cfg = sao_actor_config(
        kl_ctl=0.0,
        discount=1.0,
        sao=SAOSection(setting="sao", policy_lambda="0.9", critic_lambda=1.0, warmup_steps=10),
    )
    o = SAOPPOActor(cfg, engine=None)._compute_advantages(copy.deepcopy(data))
    m = torch.roll(data["loss_mask"], -1, -1).bool()  # the testbed's mask: position t is the action emitting token t+1
    adv_tb, _ = get_advantage("gae")(data["rewards"], m, values=data["values"], gamma=1.0, lam=0.9)
    _, ret_tb = get_advantage("gae")(data["rewards"], m, values=data["values"], gamma=1.0, lam=1.0)
    torch.testing.assert_close(o["advantages"], adv_tb)
    torch.testing.assert_close(o["returns"], ret_tb)
    assert torch.equal(o["returns"][0][m[0]], torch.ones(3))  # the outcome reaches every action of row 0
    # AReaL 1.0.4 puts row 0's and row 2's rewards at seqlens - 2, an observation token: their actions never see them
    theirs = PPOActor(
        PPOActorConfig(
            experiment_name="t", trial_name="t", backend="fsdp:d1", kl_ctl=0.0, discount=1.0, gae_lambda=1.0
        ),
        engine=None,
    )
    zero_v = copy.deepcopy(data)
    zero_v["values"].zero_()
    a = theirs._compute_advantages(zero_v)
    assert torch.equal(a["returns"][0][m[0]], torch.zeros(3)) and torch.equal(a["returns"][2][m[2]], torch.zeros(4))
    torch.testing.assert_close(a["returns"][1][m[1]], torch.full((4,), -0.5))  # a row ending on an action: as ours


@pytest.mark.parametrize("setting", ["grpo", "grpo_dis"])
def test_grpo_advantages_equal_in_both_backends_at_std_0_1e7_and_half(setting):
    from areal.api.cli_args import NormConfig
    from sao_repro.advantages import grpo_advantages

    z = torch.tensor([-1.5, -0.5, 0.5, 1.5])
    rewards = torch.cat([torch.ones(4), z / z.std() * 1e-7, z / z.std() * 0.5 + 0.25])
    B, T = 12, 7
    g = torch.Generator().manual_seed(0)
    lmask, attn = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
    for b in range(B):  # prompt 2 + 1..4 actions, right-padded
        n = int(torch.randint(1, 5, (1,), generator=g))
        lmask[b, 2 : 2 + n], attn[b, : 2 + n] = 1, 1
    data = {
        "input_ids": torch.ones(B, T, dtype=torch.long),
        "attention_mask": attn,
        "loss_mask": lmask,
        "logprobs": torch.zeros(B, T),
        "rewards": rewards,
    }
    s = get_setting(setting)
    band = {"rejection_sampling": RS} if s.band else {}
    cfg = sao_actor_config(
        kl_ctl=0.0,
        discount=1.0,
        reward_norm=NormConfig(mean_level="group", std_level="group", group_size=4),
        use_decoupled_loss=s.band is not None,
        **band,
        sao=SAOSection(setting=setting),
    )
    actor = SAOPPOActor(cfg, engine=None)
    assert type(actor.reward_norm).__name__ == "GroupRewardNorm"
    o = actor._compute_advantages(copy.deepcopy(data))
    m = torch.roll(lmask, -1, -1).bool()
    adv_tb, _ = grpo_advantages(rewards, m, group_size=4)
    torch.testing.assert_close(o["advantages"], adv_tb, rtol=0, atol=1e-6)
    assert torch.equal(o["advantages"][:8], torch.zeros(8, T))  # std 0 and 1e-7: no signal in either backend
    assert float(o["advantages"][8:][m[8:]].abs().max()) > 1.0
    theirs = PPOActor(
        PPOActorConfig(
            experiment_name="t",
            trial_name="t",
            backend="fsdp:d1",
            kl_ctl=0.0,
            discount=1.0,
            reward_norm=NormConfig(mean_level="group", std_level="group", group_size=4),
        ),
        engine=None,
    )._compute_advantages(copy.deepcopy(data))
    assert float(theirs["advantages"][4:8].abs().max()) > 5e-3  # AReaL's std + 1e-5 turns float noise into a signal


def test_version_stats_count_generated_tokens_not_padding():
    from sao_repro.areal.engine import version_stats

    # versions as AReaL pads a batch: -1 on the prompt, 0 in the padding after shorter rows
    versions = torch.tensor([[-1, -1, 5, 5, 6, 0, 0], [-1, 6, 6, 6, 6, 6, 6], [-1, -1, -1, 5, 0, 0, 0]])
    lmask = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 0, 0, 0]])
    st = version_stats(versions, 6, lmask)
    assert (st["rollout/version_min"], st["rollout/version_max"]) == (5.0, 6.0)
    assert st["rollout/resubmitted_frac"] == pytest.approx(1 / 3)
    assert version_stats(versions, 6, torch.zeros_like(lmask)) == {"rollout/trainer_version": 6.0}


def test_actor_logs_mismatch_and_lag_every_step():
    "The actor's `_compute_advantages` logs the `mismatch/` keys (lag only without recomputed log-probs)."
    data = obs_tail_batch()
    data["versions"] = torch.where(
        data["loss_mask"].bool(), torch.tensor([[4], [3], [4]]), torch.zeros(3, 9, dtype=torch.long)
    )
    data["prox_logp"] = torch.roll(data["logprobs"], -1, -1).clone()
    data["prox_logp"][1] += 0.2  # the lagged row differs; the current rows agree exactly
    for prox in (True, False):
        cfg = sao_actor_config(
            kl_ctl=0.0,
            use_decoupled_loss=prox,
            recompute_logprob=prox,
            sao=SAOSection(setting="sao", policy_lambda="1.0", warmup_steps=0, strict=False),
        )
        actor = SAOPPOActor(cfg, SimpleNamespace(get_version=lambda: 4))
        d = copy.deepcopy(data)
        if not prox:
            d.pop("prox_logp")
        tracker = DistributedStatsTracker()
        import sao_repro.areal.engine as E

        old = E.stats_tracker.scalar
        E.stats_tracker.scalar = tracker.scalar
        try:
            actor._compute_advantages(d)
        finally:
            E.stats_tracker.scalar = old
        got = tracker.export()
        assert got["mismatch/lag_max"] == 1.0 and got["mismatch/current_frac"] == pytest.approx(7 / 11)
        assert got["rollout/version_min"] == 3.0
        if prox:
            assert got["mismatch/k3_kl"] == 0.0 and got["mismatch/k3_kl_all"] > 0.0
        else:
            assert "mismatch/k3_kl" not in got and "mismatch/k3_kl_all" not in got


def test_areal_trainer_writes_a_nan_event_and_an_inf_critic_grad_norm_is_over_the_clip(tmp_path):
    "A step whose critic grad norm is inf: a `nan` event naming the key, and three in a row set critic_starved."
    from sao_repro.areal.ppo_trainer import append_metrics
    from sao_repro.metrics import scan_runs
    from sao_repro.runlog import read_events

    d = tmp_path / "areal" / "sao" / "seed1"
    for s in range(1, 6):
        append_metrics(
            str(d),
            s,
            {
                "ppo_critic/update/grad_norm": math.inf if s >= 3 else 0.5,
                "ppo_critic/update/critic/grad_clip": 1.0,
                "ppo_actor/update/actor_loss/avg": 0.1,
            },
        )
    ev = read_events(d)
    assert [(e["event"], e["details"]) for e in ev] == [
        ("nan", {"step": s, "keys": ["critic/grad_norm"]}) for s in (3, 4, 5)
    ]
    info = scan_runs(tmp_path)[0]
    assert info["flags"]["nan"] and info["flags"]["critic_starved"] and info["flag_steps"]["critic_starved"] == 5
