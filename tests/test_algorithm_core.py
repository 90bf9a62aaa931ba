"""Property tests of the algorithm core: GAE, DIS, losses, advantages, settings."""

import copy
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings as hsettings, strategies as st, HealthCheck

from sao_repro.advantages import (
    RunningMeanBaseline,
    get_advantage,
    grpo_advantages,
    register_advantage,
    running_mean_advantages,
)
from sao_repro.core import masked_mean, masked_whiten
from sao_repro.dis import dis_band, dis_mask, dis_metrics
from sao_repro.gae import (
    adaptive_lambda,
    areal_style_gae,
    gae_reference,
    reverse_linear_scan,
    sequence_reward_to_tokens,
    skip_obs_gae,
)
from sao_repro.loss import (
    PolicyLossConfig,
    PolicyLossFn,
    PolicyLossResult,
    get_policy_loss,
    list_policy_losses,
    policy_loss,
    value_loss,
)
from sao_repro.cli import settings_main
from sao_repro.settings import get_setting, list_settings, load_setting_yaml

ROOT = Path(__file__).resolve().parents[1]
HS = dict(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def gae_batches(draw):
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    p_action = draw(st.floats(0.0, 1.0))
    mask = torch.rand(B, T, generator=g) < p_action
    rewards = torch.randn(B, T, generator=g)
    values = torch.randn(B, T, generator=g)
    gamma = draw(st.floats(1e-3, 1.0))
    per_row = draw(st.booleans())
    lam = torch.rand(B, generator=g).clamp(min=1e-6) if per_row else draw(st.floats(1e-6, 1.0))
    return rewards, values, mask, gamma, lam


@hsettings(**HS)
@given(gae_batches())
def test_gae_matches_reference(batch):
    rewards, values, mask, gamma, lam = batch
    a_ref, r_ref = gae_reference(rewards, values, mask, gamma, lam)
    a, r = skip_obs_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(a, a_ref, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(r, r_ref, atol=2e-4, rtol=2e-4)
    # the AReaL-style per-position loop follows the same contract
    a_loop, _ = areal_style_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(a_loop, a_ref, atol=2e-4, rtol=2e-4)


@hsettings(**HS)
@given(gae_batches())
def test_gae_junk_off_mask_changes_nothing(batch):
    rewards, values, mask, gamma, lam = batch
    a, r = skip_obs_gae(rewards, values, mask, gamma, lam)
    junk = torch.full_like(rewards, float("nan"))
    a2, r2 = skip_obs_gae(
        torch.where(mask, rewards, junk), torch.where(mask, values, junk * 0 + 1e30), mask, gamma, lam
    )
    torch.testing.assert_close(a2, a)
    torch.testing.assert_close(r2, r)
    assert (a[~mask] == 0).all() and (r[~mask] == 0).all()


def test_gae_inputs_not_modified():
    r, v = torch.randn(3, 9), torch.randn(3, 9)
    m = torch.rand(3, 9) < 0.6
    r0, v0, m0 = r.clone(), v.clone(), m.clone()
    skip_obs_gae(r, v, m, 0.9, 0.8)
    assert torch.equal(r, r0) and torch.equal(v, v0) and torch.equal(m, m0)


def test_gae_long_rows_blocked_scan_stays_accurate():
    # rows long enough that the scan splits into blocks at several levels
    g = torch.Generator().manual_seed(1)
    B, T = 2, 3000
    r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    m = torch.rand(B, T, generator=g) < 0.9
    for gamma, lam in [(0.99, 0.95), (0.5, 0.5), (1.0, 1e-12)]:
        a, _ = skip_obs_gae(r, v, m, gamma, lam)
        a_ref, _ = areal_style_gae(r.double(), v.double(), m, gamma, lam)
        torch.testing.assert_close(a.double(), a_ref, atol=1e-4, rtol=1e-4)


def test_reverse_linear_scan_float64_matches_loop():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 500, dtype=torch.float64, generator=g)
    ld = -torch.rand(3, 500, dtype=torch.float64, generator=g) * 3
    out = reverse_linear_scan(x, ld)
    ref = torch.zeros_like(x)
    acc = torch.zeros(3, dtype=torch.float64)
    for t in reversed(range(500)):
        acc = x[:, t] + torch.exp(ld[:, t]) * acc
        ref[:, t] = acc
    torch.testing.assert_close(out, ref)


def test_gae_shape_errors():
    with pytest.raises(ValueError, match="`values` has shape"):
        skip_obs_gae(torch.zeros(2, 3), torch.zeros(3, 2), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        skip_obs_gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="`lam`"):
        skip_obs_gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), lam=torch.ones(3))


def test_sequence_reward_and_adaptive_lambda():
    m = torch.tensor([[False, True, True, False], [True, False, True, True]])
    out = sequence_reward_to_tokens(torch.tensor([2.0, -1.0]), m)
    assert out.tolist() == [[0, 0, 2, 0], [0, 0, 0, -1]]
    lam = adaptive_lambda(torch.tensor([1, 3, 100]), alpha=1.5)
    torch.testing.assert_close(lam, torch.tensor([1 - 1 / 1.5, 1 - 1 / 4.5, 1 - 1 / 150]))


# ---------------------------------------------------------------- DIS
def test_dis_band_conventions_and_errors():
    for bad in [(0.0, 5.0), (-1, 5.0), (1.0, 5.0), (0.5, 1.0), (0.5, 0.9)]:
        with pytest.raises(ValueError, match="DIS band"):
            dis_band(*bad)
    with pytest.raises(ValueError, match="eps"):
        dis_band(0.3, 5.0, "percent")


def test_dis_edges_and_nonfinite():
    lo, hi = 0.3, 5.0
    lr = torch.tensor(
        [
            [
                math.log(lo),
                math.log(hi),
                math.log(lo) - 1e-4,
                math.log(hi) + 1e-4,
                1e6,
                -1e6,
                float("nan"),
                float("inf"),
                float("-inf"),
                0.0,
            ]
        ],
        dtype=torch.float64,
    )
    behav = torch.zeros_like(lr)
    mask = torch.ones_like(lr, dtype=torch.bool)
    keep = dis_mask(lr, behav, mask, (lo, hi))
    assert keep.tolist() == [[True, True, False, False, False, False, False, False, False, True]]
    met = dis_metrics(lr, behav, mask, (lo, hi))
    assert met["dis/kept_frac"] == pytest.approx(0.3)
    assert met["dis/masked_below_frac"] == pytest.approx(0.2)
    assert met["dis/masked_above_frac"] == pytest.approx(0.2)
    assert met["dis/nonfinite_frac"] == pytest.approx(0.3)
    assert sum(
        met[k] for k in ["dis/kept_frac", "dis/masked_below_frac", "dis/masked_above_frac", "dis/nonfinite_frac"]
    ) == pytest.approx(1.0)
    assert all(math.isfinite(met[k]) for k in ["dis/ratio_p01", "dis/ratio_p50", "dis/logp_abs_diff"])


def test_dis_metrics_are_token_weighted():
    # one long sequence mostly masked, one short kept sequence: token weighting, not a per-row mean
    logp = torch.zeros(2, 10)
    logp[0, :9] = 5.0
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, :9] = True
    mask[1, :1] = True
    met = dis_metrics(logp, torch.zeros(2, 10), mask, (0.3, 5.0))
    assert met["dis/masked_above_frac"] == pytest.approx(0.9)


@hsettings(**HS)
@given(st.integers(0, 10_000))
def test_policy_loss_zero_gradient_on_dropped_tokens(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 7
    logp = (torch.randn(B, T, generator=g) * 2).requires_grad_()
    behav = torch.randn(B, T, generator=g) * 2
    adv = torch.randn(B, T, generator=g)
    mask = torch.rand(B, T, generator=g) < 0.8
    for form in ("direct", "decoupled"):
        loss, _ = policy_loss(logp, behav, adv, mask, band=(0.3, 5.0), form=form, prox_logp=logp.detach())
        (grad,) = torch.autograd.grad(loss, logp)
        kept = dis_mask(logp, behav, mask, (0.3, 5.0))
        assert (grad[~kept] == 0).all()
        assert torch.isfinite(grad).all()


def test_policy_loss_junk_off_mask_changes_nothing():
    g = torch.Generator().manual_seed(3)
    logp, behav, adv = torch.randn(2, 6, generator=g), torch.randn(2, 6, generator=g), torch.randn(2, 6, generator=g)
    mask = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    base, _ = policy_loss(logp, behav, adv, mask, band=(0.3, 5.0))
    junk = lambda t, v: torch.where(mask, t, torch.full_like(t, v))
    again, _ = policy_loss(junk(logp, float("nan")), junk(behav, float("inf")), junk(adv, 1e9), mask, band=(0.3, 5.0))
    torch.testing.assert_close(again, base)


def test_policy_loss_direct_value_and_denominator_flag():
    logp = torch.tensor([[0.0, 3.0, 0.0]])
    behav = torch.zeros(1, 3)
    adv = torch.tensor([[2.0, 1.0, -1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    l_keep, _ = policy_loss(logp, behav, adv, mask, band=(0.3, 5.0))
    l_drop, _ = policy_loss(logp, behav, adv, mask, band=(0.3, 5.0), dropped_in_denominator=False)
    assert float(l_keep) == pytest.approx((-2 + 1) / 3)
    assert float(l_drop) == pytest.approx((-2 + 1) / 2)
    with pytest.raises(ValueError, match="form"):
        policy_loss(logp, behav, adv, mask, form="vanilla")


def test_policy_losses_one_signature_named_result():
    "Every registered loss takes the PolicyLossFn arguments and returns a PolicyLossResult whose keep-mask is the DIS mask."
    import inspect

    want = list(inspect.signature(PolicyLossFn.__call__).parameters)[1:]
    g = torch.Generator().manual_seed(5)
    logp, behav, adv = (torch.randn(2, 5, generator=g) * 2 for _ in range(3))
    mask = torch.rand(2, 5, generator=g) < 0.8
    cfg = PolicyLossConfig(band=(0.3, 5.0))
    for name in list_policy_losses():
        fn = get_policy_loss(name)
        assert list(inspect.signature(fn).parameters) == want, name
        res = fn(logp, behav, logp, adv, mask, cfg)
        assert isinstance(res, PolicyLossResult) and res.loss_mat.shape == (2, 5)
        dis = dis_mask(res.dis_logp, behav, mask, cfg.band)
        assert torch.equal(res.keep, mask if name == "ppo_clip" else dis), name


def test_value_loss_clip():
    v = torch.tensor([[2.0]], requires_grad=True)
    loss, met = value_loss(
        v, torch.zeros(1, 1), torch.tensor([[2.0]]), torch.ones(1, 1, dtype=torch.bool), eps_clip=0.5
    )
    assert float(loss.detach()) == pytest.approx(0.5 * 1.5**2)
    loss.backward()
    assert float(v.grad) == 0.0  # the clipped branch is active and has no gradient to v


# ---------------------------------------------------------------- advantages
@hsettings(**HS)
@given(st.integers(1, 6), st.sampled_from([2, 4, 8]), st.integers(0, 10_000))
def test_grpo_groups_sum_to_zero_and_never_nan(n_groups, G, seed):
    g = torch.Generator().manual_seed(seed)
    r = (torch.rand(n_groups * G, generator=g) < 0.5).float()
    mask = torch.ones(n_groups * G, 3, dtype=torch.bool)
    adv, _ = grpo_advantages(r, mask, group_size=G)
    per_seq = adv[:, 0].view(n_groups, G)
    assert torch.isfinite(adv).all()
    torch.testing.assert_close(per_seq.sum(1), torch.zeros(n_groups), atol=1e-5, rtol=0)
    same = r.view(n_groups, G).std(1) == 0
    assert (per_seq[same] == 0).all()


def test_running_mean_state_round_trip_and_no_self_baseline():
    b = RunningMeanBaseline()
    mask = torch.ones(3, 2, dtype=torch.bool)
    adv, _ = running_mean_advantages(torch.tensor([1.0, 1.0, 1.0]), mask, baseline=b)
    assert adv[:, 0].tolist() == [1.0, 1.0, 1.0]  # the batch does not baseline itself
    running_mean_advantages(torch.tensor([0.0, 0.0, 1.0]), mask, baseline=b)
    restored = RunningMeanBaseline().load_state_dict(b.state_dict())
    nxt = torch.tensor([1.0, 0.0, 0.0])
    a1, _ = running_mean_advantages(nxt, mask, baseline=b)
    a2, _ = running_mean_advantages(nxt, mask, baseline=restored)
    torch.testing.assert_close(a1, a2)
    assert b.state_dict() == restored.state_dict()
    ema = RunningMeanBaseline("ema", 0.9)
    ema.update(torch.tensor([1.0]))
    ema2 = RunningMeanBaseline().load_state_dict(ema.state_dict())
    assert ema2.mode == "ema" and ema2.mean == ema.mean


def test_registry_rules():
    with pytest.raises(ValueError, match="batch_norm, gae, grpo, running_mean"):
        get_advantage("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda rewards, loss_mask, **kw: None)


# ---------------------------------------------------------------- settings
def test_settings_registry_and_yaml_agree(tmp_path):
    "configs/settings/*.yaml are what `sao-repro settings --write-yaml` writes today, one per setting, nothing else."
    assert settings_main(["--write-yaml", str(tmp_path)]) == 0
    shipped = ROOT / "configs" / "settings"
    assert sorted(p.name for p in shipped.glob("*.yaml")) == sorted(p.name for p in tmp_path.glob("*.yaml"))
    for name in list_settings():
        path = shipped / f"{name}.yaml"
        assert path.read_text() == (tmp_path / f"{name}.yaml").read_text(), (
            f"{path}: run sao-repro settings --write-yaml"
        )
        assert load_setting_yaml(path) == get_setting(name)


def test_each_knob_help_is_declared_once():
    "A knob's help text is written once in the package (on `Setting`); both backends' options show it from there."
    from dataclasses import fields as dc_fields

    from sao_repro.areal.config import SAOSection
    from sao_repro.mini.config import MiniRunConfig
    from sao_repro.settings import Setting

    sources = [p.read_text() for p in (ROOT / "sao_repro").rglob("*.py") if p.name != "_modidx.py"]
    helps = {f.name: f.metadata["help"] for f in dc_fields(Setting)}
    for name, text in helps.items():
        # as a string literal, and for a text long enough to be unmistakable, anywhere (a comment, a longer help)
        n = sum(s.count(text if len(text) >= 20 else f'"{text}"') for s in sources)
        assert n == 1, f"the help of {name!r} is written {n} times in the package"
    mini = {f.name: f.metadata["help"] for f in dc_fields(MiniRunConfig)}
    areal = {f.name: f.metadata["help"] for f in dc_fields(SAOSection)}
    for knob, mini_name in [
        ("critic_k", "critic_k"),
        ("warmup_steps", "warmup_steps"),
        ("critic_freeze", "critic_freeze"),
        ("dis_band", "dis_band"),
        ("adv_whiten", "adv_whiten"),
        ("policy_lambda", "policy_lambda"),
    ]:
        assert mini[mini_name].startswith(helps[knob]), (knob, mini[mini_name])
    for knob in [
        "critic_k",
        "warmup_steps",
        "policy_lambda",
        "lambda_alpha",
        "critic_lambda",
        "critic_freeze",
        "dis_band",
        "adv_whiten",
    ]:
        assert areal[knob].startswith(helps[knob]), (knob, areal[knob])


def test_settings_match_the_design_table():
    s = {n: get_setting(n) for n in list_settings()}
    assert (s["sao"].group_size, s["sao"].critic, s["sao"].critic_k, s["sao"].warmup_steps) == (1, True, 2, 10)
    assert s["grpo"].group_size == 8 and s["grpo"].band is None
    assert s["grpo_dis"].band == (0.3, 5.0) and s["grpo_dis"].advantage == "grpo"
    assert s["running_mean"].band is None and s["running_mean"].advantage == "running_mean"
    assert s["single_dis"].band == (0.3, 5.0) and s["single_dis"].advantage == "batch_norm"
    # equal trajectories per step
    assert {x.prompts_per_step(512) * x.group_size for x in s.values()} == {512}
    with pytest.raises(ValueError, match="sao, grpo, grpo_dis, running_mean, single_dis"):
        get_setting("ppo")
    with pytest.raises(ValueError, match="comparison, ablation"):
        list_settings("arms")


def test_settings_command_lists_the_ablation_arms_marked(capsys):
    "`sao-repro settings`: the five compared settings, then the paper's three arms, each marked by its group."
    from sao_repro.settings import SETTING_COLORS

    assert settings_main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {l.split()[0]: l.split()[1] for l in lines[1:9]}
    assert rows == {
        **dict.fromkeys(list_settings("comparison"), "comparison"),
        **dict.fromkeys(["vapo", "sao_k1", "sao_frozen"], "ablation"),
    }
    assert list(rows) == list_settings()
    assert len({SETTING_COLORS[s] for s in list_settings()}) == 8  # one colour each, in the report and the monitor
    with pytest.raises(ValueError, match="group='arm'"):
        type(get_setting("sao"))("x", group="arm")


def test_core_masked_ops_ignore_junk():
    x = torch.tensor([[1.0, float("inf")], [3.0, float("nan")]])
    m = torch.tensor([[True, False], [True, False]])
    assert float(masked_mean(x, m)) == 2.0
    w = masked_whiten(x, m)
    assert torch.isfinite(w).all()


# ---------------------------------------------------------------- critic
def _table_critic(vocab=7):
    from torch import nn

    class TableCritic(nn.Module):
        def __init__(self):
            super().__init__()
            self.v = nn.Embedding(vocab, 1)

        def forward(self, tokens):
            return self.v(tokens).squeeze(-1)

    torch.manual_seed(0)
    return TableCritic()


def test_critic_trainer_resume_is_exact_and_counts_passes():
    from sao_repro.critic import CriticTrainer

    g = torch.Generator().manual_seed(5)
    toks = torch.randint(0, 7, (6, 5), generator=g)
    mask = torch.rand(6, 5, generator=g) < 0.8
    rets = torch.randn(6, 5, generator=g)
    a = CriticTrainer(_table_critic(), lr=0.05, k_passes=2, n_minibatches=3, seed=1)
    steps = []
    orig_step = a.opt.step
    a.opt.step = lambda *args, **kw: (steps.append(1), orig_step(*args, **kw))[1]
    a.update(toks, mask, rets)
    assert len(steps) == 2 * 3  # K passes x minibatches optimizer steps
    state = copy.deepcopy(a.state_dict())
    b = CriticTrainer(_table_critic(), lr=0.05, k_passes=2, n_minibatches=3, seed=99).load_state_dict(state)
    ma, mb = a.update(toks, mask, rets), b.update(toks, mask, rets)
    assert ma == mb
    torch.testing.assert_close(a.values(toks), b.values(toks))


def test_critic_metrics_and_validation():
    from sao_repro.critic import CriticTrainer, explained_variance

    ct = CriticTrainer(_table_critic(), lr=0.1, warmup_steps=3)
    assert [ct.in_warmup(s) for s in range(5)] == [True, True, True, False, False]
    m = ct.update(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool), torch.randn(2, 3))
    assert set(m) == {
        "critic/value_loss",
        "critic/explained_var",
        "critic/grad_norm",
        "critic/grad_norm_max",
        "critic/grad_clip",
        "critic/returns_std",
    }
    assert math.isnan(explained_variance(torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool)))
    with pytest.raises(ValueError, match="n_minibatches"):
        CriticTrainer(_table_critic(), n_minibatches=0)


# ---------------------------------------------------------------- docstrings
def _paper_docstrings():
    "Each algorithm function -> the sources its docstring must cite (the equation it computes comes from there)."
    from sao_repro.advantages import batch_norm_advantages, gae_advantages, group_normalize
    from sao_repro.critic import explained_variance
    from sao_repro.dis import dis_split
    from sao_repro.loss import dis_decoupled, dis_direct, ppo_clip

    sao, gae, grpo = "arXiv:2607.07508", "arXiv:1506.02438", "arXiv:2402.03300"
    return {
        dis_mask: (sao, "eq. 1-3"),
        dis_split: (sao,),
        ppo_clip: ("arXiv:1707.06347", "eq. 7"),
        dis_direct: (sao, "eq. 1-3"),
        dis_decoupled: ("arXiv:2110.00641", "arXiv:2505.24298", sao),
        skip_obs_gae: (gae, "eq. 16", sao, "eq. 4-5"),
        gae_reference: (gae, "eq. 16"),
        adaptive_lambda: ("arXiv:2504.05118",),
        gae_advantages: (gae, "eq. 16", sao),
        group_normalize: (grpo, "section 4.1"),
        grpo_advantages: (grpo, "section 4.1"),
        batch_norm_advantages: (grpo,),
        RunningMeanBaseline: (sao,),
        running_mean_advantages: (sao,),
        value_loss: ("arXiv:2505.24298", "lambda = 1"),
        explained_variance: ("CleanRL",),
    }


@pytest.mark.parametrize("fn", list(_paper_docstrings()), ids=lambda f: f.__name__)
def test_algorithm_docstrings_name_their_source_and_shapes(fn):
    "rlax style: the docstring a reader meets in the .py file cites its paper, gives shapes, names each tensor argument."
    import inspect
    import re
    from fastcore.docments import docments

    doc = inspect.getdoc(fn) or ""
    missing = [s for s in _paper_docstrings()[fn] if s not in doc]
    assert not missing, f"{fn.__name__}'s docstring does not cite {missing}"
    assert "Shapes:" in doc and "[B" in doc, f"{fn.__name__}'s docstring gives no `Shapes:` of its arguments"
    lines = [line for line in doc.splitlines() if line.strip()]
    assert len(lines) <= 8, (
        f"{fn.__name__}'s docstring has {len(lines)} lines; keep it to 8, the derivation in the notebook"
    )
    documented = docments(PolicyLossFn.__call__ if fn.__name__ in list_policy_losses() else fn)
    tensors = [p for p, c in documented.items() if c and c.startswith("[")]  # the arguments documented with a shape
    unnamed = [p for p in tensors if not re.search(rf"(?<![\w.]){p}\b", doc)]
    assert not unnamed, f"{fn.__name__}'s docstring never names its tensor arguments {unnamed}"
