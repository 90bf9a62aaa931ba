"""The engine-vs-trainer mismatch figures: vectorized against the plain loop, junk off the mask, lag apart."""

import math

import pytest
import torch
from hypothesis import given, settings as hsettings, strategies as st, HealthCheck

from sao_repro.mismatch import MISMATCH_KEYS, mismatch_metrics, mismatch_reference

HS = dict(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def batches(draw):
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 30))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    mask = torch.rand(B, T, generator=g) < draw(st.floats(0.0, 1.0))
    logp = -torch.rand(B, T, generator=g) * 5
    behav = logp + torch.randn(B, T, generator=g) * draw(st.floats(0.0, 3.0))
    V = draw(st.integers(0, 6))
    versions = torch.randint(0, V + 1, (B, T), generator=g)
    if draw(st.booleans()):  # a batch of one version, as the testbed makes
        versions = torch.full((B, T), draw(st.integers(0, V)))
    if draw(st.booleans()):  # an engine reporting -inf for some token
        behav = torch.where(torch.rand(B, T, generator=g) < 0.1, torch.full_like(behav, float("-inf")), behav)
    return logp, behav, versions, mask, V


@hsettings(**HS)
@given(batches())
def test_vectorized_agrees_with_the_loop(b):
    logp, behav, versions, mask, V = b
    got, ref = mismatch_metrics(logp, behav, versions, mask, V), mismatch_reference(logp, behav, versions, mask, V)
    assert set(got) == set(ref) and set(got) <= set(MISMATCH_KEYS)
    for k in got:
        assert got[k] == pytest.approx(ref[k], rel=1e-6, abs=1e-9), k


@hsettings(**HS)
@given(batches(), st.integers(0, 2**31 - 1))
def test_junk_off_the_mask_changes_nothing(b, seed):
    logp, behav, versions, mask, V = b
    g = torch.Generator().manual_seed(seed)
    off = ~mask
    junk_lp = torch.where(off, torch.randn(logp.shape, generator=g) * 100, logp)
    junk_lp[off & (torch.rand(logp.shape, generator=g) < 0.3)] = float("nan")
    junk_bh = torch.where(off, torch.full_like(behav, float("inf")), behav)
    junk_v = torch.where(off, torch.randint(-5, 50, versions.shape, generator=g), versions)
    assert mismatch_metrics(junk_lp, junk_bh, junk_v, mask, V) == mismatch_metrics(logp, behav, versions, mask, V)


def test_inputs_are_not_changed():
    g = torch.Generator().manual_seed(0)
    logp, behav = -torch.rand(3, 8, generator=g), -torch.rand(3, 8, generator=g)
    versions, mask = torch.randint(0, 3, (3, 8), generator=g), torch.rand(3, 8, generator=g) < 0.7
    before = [t.clone() for t in (logp, behav, versions, mask)]
    mismatch_metrics(logp, behav, versions, mask, 2)
    assert all(torch.equal(a, b) for a, b in zip(before, (logp, behav, versions, mask)))


def test_lag_apart_from_mismatch():
    """Identical numerics on current tokens and a large gap on lagged ones: k3_kl stays 0 while k3_kl_all and the
    lag show the old tokens; the same gap on current tokens shows in k3_kl."""
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 16, generator=g) * 3
    mask = torch.ones(4, 16, dtype=torch.bool)
    versions = torch.tensor([7, 7, 5, 4])[:, None].expand(4, 16)
    behav = logp.clone()
    behav[2:] += torch.randn(2, 16, generator=g)
    m = mismatch_metrics(logp, behav, versions, mask, 7)
    assert m["mismatch/k3_kl"] == 0.0 and m["mismatch/k3_kl_all"] > 0.05
    assert m["mismatch/lag_max"] == 3.0 and m["mismatch/lag_mean"] == pytest.approx((0 + 0 + 2 + 3) / 4)
    assert m["mismatch/current_frac"] == 0.5 and m["mismatch/ess"] < 1.0
    assert mismatch_metrics(logp, behav, torch.full_like(versions, 7), mask, 7)["mismatch/k3_kl"] > 0.05


def test_no_current_token_leaves_k3_kl_out():
    logp, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    m = mismatch_metrics(logp, logp - 0.1, torch.full((2, 3), 2), mask, 4)
    assert "mismatch/k3_kl" not in m and m["mismatch/current_frac"] == 0.0
    assert m["mismatch/k3_kl_all"] == pytest.approx(math.expm1(0.1) - 0.1)
    assert m["mismatch/lag_max"] == 2.0


def test_huge_ratios_do_not_overflow():
    logp = torch.tensor([[0.0, 0.0, 0.0]])
    behav = torch.tensor([[-800.0, 0.0, 800.0]], dtype=torch.float64)
    m = mismatch_metrics(
        logp.double(), behav, torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool), 0
    )
    assert all(math.isfinite(v) or k in ("mismatch/k3_kl", "mismatch/k3_kl_all") for k, v in m.items())
    assert m["mismatch/ess"] == pytest.approx(1 / 3)  # one ratio dominates: the effective sample is one token of three


# ---------------------------------------------------------------- the testbed logs them every step
from sao_repro.mini.train import MiniTrainer, read_metrics, train_run  # noqa: E402
from mini_helpers import smoke_cache, smoke_cfg, strip_perf  # noqa: E402,F401 (smoke_cache: an autouse fixture)

LAG_KEYS = ("mismatch/lag_mean", "mismatch/lag_max", "mismatch/current_frac")


def test_testbed_logs_mismatch_apart_from_lag_every_step(tmp_path):
    d = train_run(smoke_cfg("grpo_dis", tmp_path, steps=8, lag=2, lag_mode="random", noise=1.0), log=None)
    ms = read_metrics(d)
    assert {m["rollout/policy_lag"] for m in ms} == {0, 1, 2}  # this seed draws every lag
    for m in ms:
        lag = m["rollout/policy_lag"]
        assert all(
            k in m
            for k in LAG_KEYS
            + (
                "mismatch/k3_kl_all",
                "mismatch/ess",
                "mismatch/ratio_min",
                "mismatch/ratio_max",
                "mismatch/log_ratio_p01",
                "mismatch/log_ratio_p99",
            )
        )
        assert m["mismatch/lag_max"] == m["mismatch/lag_mean"] == lag
        assert m["mismatch/current_frac"] == (1.0 if lag == 0 else 0.0)
        assert ("mismatch/k3_kl" in m) == (lag == 0)  # the trainer's own version: lag 0 only
        assert m["mismatch/log_ratio_p01"] <= m["mismatch/log_ratio_p99"] and 0 < m["mismatch/ess"] <= 1
    assert all(m["mismatch/k3_kl"] > 1e-3 for m in ms if "mismatch/k3_kl" in m)  # the injected logit noise


def _sync_rollout(self):
    "A synchronous loop: the trainer's own policy object samples the batch (no copy, no history)."
    from sao_repro.mini.rollout import collect, pick_lag
    from sao_repro.mini.task import sample_problems

    cfg, s = self.cfg, self.setting
    lag = pick_lag(cfg.rollout(), self.step, self.rng)
    assert lag == 0
    prompts = sample_problems(cfg.task(), cfg.trajectories_per_step // s.group_size, "train", self.rng)
    problems = [p for p in prompts for _ in range(s.group_size)]
    return collect(self.policy, problems, cfg.task(), self.gen, noise=cfg.noise, dtype=cfg.behav_dtype), lag


@pytest.mark.parametrize(
    "setting, kw", [("single_dis", {}), ("grpo_dis", {"minibatches": 2}), ("sao", {"warmup_steps": 1})]
)
def test_lag_0_without_noise_is_the_synchronous_loop(setting, kw, tmp_path, monkeypatch):
    """Lag 0, no logit noise: the behaviour policy is the trainer's weights bit for bit, the exact engine reports
    the trainer's own log-probs, so every ratio is 1 (k3 0), nothing is masked, and every metric equals the
    synchronous loop's."""
    import sao_repro.mini.train as MT

    cfg = smoke_cfg(setting, tmp_path / "async", steps=4, lag=0, noise=0.0, **kw)
    tr = MiniTrainer(cfg, log=None)
    ro, lag = tr.rollout()
    assert lag == 0 and all(
        torch.equal(a, b) for a, b in zip(tr.behav.state_dict().values(), tr.policy.state_dict().values())
    )
    ms = read_metrics(train_run(cfg, log=None))
    for m in ms:
        assert m["mismatch/lag_max"] == 0.0 and m["mismatch/current_frac"] == 1.0
        assert m["mismatch/k3_kl"] == m["mismatch/k3_kl_all"] == 0.0
        assert m["mismatch/ratio_min"] == m["mismatch/ratio_max"] == 1.0 and m["mismatch/ess"] == 1.0
        assert m["mismatch/log_ratio_p01"] == m["mismatch/log_ratio_p99"] == 0.0
        assert m["dis/masked_below_frac"] == 0.0 and m["dis/masked_above_frac"] == 0.0 and m["dis/kept_frac"] == 1.0
    monkeypatch.setattr(MT.MiniTrainer, "rollout", _sync_rollout)
    sync = read_metrics(train_run(smoke_cfg(setting, tmp_path / "sync", steps=4, lag=0, noise=0.0, **kw), log=None))
    assert strip_perf(sync) == strip_perf(ms)
