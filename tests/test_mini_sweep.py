"""Testbed knobs (minibatches, critic overrides, policy_lambda) and `sao-repro sweep` (sao_repro.mini.sweep)."""

import json
import math
from pathlib import Path

import pytest
import torch

from sao_repro.loss import policy_loss
from sao_repro.mini.cli import run_main
from sao_repro.mini.model import token_logp
from sao_repro.mini.sweep import load_sweep, paired_effect, sweep_main
from sao_repro.mini.train import MiniTrainer, NonFiniteError, checkpoints, read_metrics, train_run
from mini_helpers import smoke_cache, smoke_cfg, strip_perf  # noqa: F401 (smoke_cache: an autouse fixture)

REPO = Path(__file__).resolve().parent.parent
SMOKE_SWEEP = REPO / "configs" / "sweeps" / "smoke.yaml"


def adam_steps(opt_state):
    return {int(s["step"]) for s in opt_state["state"].values()}


# ---------------------------------------------------------------- knobs
def test_minibatches_1_is_one_step_on_the_whole_batch(tmp_path):
    "minibatches=1 (the default) is the pre-knob update: one clipped Adam step on the full-batch loss, written out by hand."
    cfg = smoke_cfg("grpo_dis", tmp_path, minibatches=1)
    a, b = MiniTrainer(cfg, log=None), MiniTrainer(cfg, log=None)
    gen_before = a.mb_gen.get_state()
    for _ in range(3):
        a.train_step()
        ro, _ = b.rollout()
        adv, _ = b.advantages(ro, None)
        loss, _ = policy_loss(
            token_logp(b.policy(ro.tokens), ro.tokens), ro.behav_logp, adv, ro.loss_mask, band=b.setting.band
        )
        b.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(b.policy.parameters(), cfg.max_grad_norm)
        b.opt.step()
        b.step += 1
        b.history.push(b.step, b.policy)
    assert all(torch.equal(p, q) for p, q in zip(a.policy.parameters(), b.policy.parameters()))
    assert torch.equal(a.mb_gen.get_state(), gen_before)  # the minibatch generator is not touched
    assert adam_steps(a.opt.state_dict()) == {3}


def test_minibatches_2_does_two_optimizer_steps(tmp_path):
    one = train_run(smoke_cfg("grpo_dis", tmp_path / "a", steps=3), log=None)
    two = train_run(smoke_cfg("grpo_dis", tmp_path / "b", steps=3, minibatches=2), log=None)
    assert [m["actor/n_updates"] for m in read_metrics(one)] == [1, 1, 1]
    assert [m["actor/n_updates"] for m in read_metrics(two)] == [2, 2, 2]
    ca, cb = (torch.load(checkpoints(d)[-1], weights_only=False) for d in (one, two))
    assert adam_steps(ca["opt"]) == {3} and adam_steps(cb["opt"]) == {6}
    assert any(not torch.equal(ca["policy"][k], cb["policy"][k]) for k in ca["policy"])
    assert json.loads((two / "config.json").read_text())["minibatches"] == 2


def test_resume_with_minibatches_and_critic_knobs_is_exact(tmp_path):
    "sao with 2 minibatches, 2 warmup steps, K=1, a narrower critic and lambda 0.9: a NaN crash + resume equals the full run."
    kw = dict(steps=8, lag_mode="random", minibatches=2, warmup_steps=2, critic_k=1, critic_width=16, policy_lambda=0.9)
    full = train_run(smoke_cfg("sao", tmp_path / "a", **kw), log=None)
    with pytest.raises(NonFiniteError):
        train_run(smoke_cfg("sao", tmp_path / "b", debug_nan_step=6, **kw), log=None)
    d = train_run(smoke_cfg("sao", tmp_path / "b", **kw), resume=True, log=None)
    a, b = read_metrics(full), read_metrics(d)
    assert [m["step"] for m in b] == list(range(1, 9))
    assert strip_perf(a) == strip_perf(b)
    assert [m["actor/n_updates"] for m in a] == [0, 0] + [2] * 6
    assert {m["adv/lambda_mean"] for m in a} == {0.9}
    pa, pb = (torch.load(checkpoints(x)[-1], weights_only=False) for x in (full, d))
    assert all(torch.equal(pa["policy"][k], pb["policy"][k]) for k in pa["policy"])
    assert torch.equal(pa["mb_gen"], pb["mb_gen"])
    assert pa["critic"]["model"]["value_head.weight"].shape == (1, 16)  # the narrower critic
    conf = json.loads((d / "config.json").read_text())
    assert (
        conf["critic_width"],
        conf["setting_spec"]["critic_k"],
        conf["setting_spec"]["warmup_steps"],
        conf["setting_spec"]["policy_lambda"],
    ) == (16, 1, 2, 0.9)


def test_run_cli_knobs_and_note_without_critic(tmp_path, capsys):
    argv = [
        "--setting",
        "running_mean",
        "--smoke",
        "--out",
        str(tmp_path),
        "--minibatches",
        "2",
        "--critic-k",
        "3",
        "--policy-lambda",
        "adaptive",
    ]
    assert run_main(argv) == 0
    assert "running_mean has no critic" in capsys.readouterr().out
    d = tmp_path / "mini" / "running_mean" / "seed0"
    conf = json.loads((d / "config.json").read_text())
    assert (conf["minibatches"], conf["critic_k"], conf["policy_lambda"]) == (2, 3, "adaptive")
    assert all(m["actor/n_updates"] == 2 for m in read_metrics(d))
    with pytest.raises(SystemExit):
        run_main(["--setting", "sao", "--policy-lambda", "adapt"])
    assert "adapt" in capsys.readouterr().err


# ---------------------------------------------------------------- effect sizes and config errors
def test_paired_effect_arithmetic():
    # per-seed differences 0.1, 0.2, 0.0 (seed 3 has no partner): mean 0.1, s_d 0.1, t_{0.975,2} = 4.302653
    m, h, n = paired_effect({0: 0.6, 1: 0.7, 2: 0.5, 3: 0.9}, {0: 0.5, 1: 0.5, 2: 0.5})
    assert n == 3
    assert m == pytest.approx(0.1)
    assert h == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-6)
    m, h, n = paired_effect(
        {0: 0.6, 1: 0.4}, {0: 0.5, 1: 0.5}
    )  # +0.1, -0.1: mean 0, s_d = 0.1414, t_{0.975,1} = 12.7062
    assert (m, n) == (pytest.approx(0.0), 2)
    assert h == pytest.approx(12.706205 * math.sqrt(0.02) / math.sqrt(2), rel=1e-6)
    m, h, n = paired_effect({0: 0.6}, {0: 0.5})
    assert n == 1 and m == pytest.approx(0.1) and math.isnan(h)


@pytest.mark.parametrize(
    "text,name",
    [
        ("name: t\nsettings: [grpo]\nseed: 2\nsteps: 3\n", "'seed'"),  # top-level typo
        ("name: t\nsettings: [grpo]\nseeds: 2\nsteps: 3\ngrid: {lagg: [1, 2]}\n", "'lagg'"),  # unknown knob
        ("name: t\nsettings: [grpo]\nseeds: 2\nsteps: 3\nbase: {nosie: 1.0}\n", "'nosie'"),
    ],
)
def test_bad_sweep_config_names_the_key(tmp_path, capsys, text, name):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=name):
        load_sweep(p)
    assert sweep_main([str(p), "--out", str(tmp_path)]) == 2
    assert name in capsys.readouterr().err
    assert not (tmp_path / "sweeps").exists()


def test_shipped_sweep_configs_load():
    big = load_sweep(REPO / "configs" / "sweeps" / "staleness_noise.yaml")
    assert len(big.points()) == 6 and len(big.settings) == 5 and big.seeds == [0, 1, 2] and big.steps == 400


# ---------------------------------------------------------------- the smoke sweep end to end, twice
@pytest.mark.slow
def test_smoke_sweep_end_to_end_skips_and_resumes(tmp_path, capsys):
    sc = load_sweep(SMOKE_SWEEP)
    assert sweep_main([str(SMOKE_SWEEP), "--out", str(tmp_path), "--jobs", "2"]) == 0
    root = tmp_path / "sweeps" / sc.name
    runs = sorted(root.glob("*/mini/*/seed*"))
    assert len(runs) == len(sc.points()) * len(sc.settings) * len(sc.seeds) == 8
    for d in runs:
        assert [m["step"] for m in read_metrics(d)] == list(range(1, sc.steps + 1))
        assert (d / "run_setting.ipynb").exists()
    noisy = root / "noise=1.0" / "mini" / "running_mean" / "seed1"
    assert json.loads((noisy / "config.json").read_text())["noise"] == 1.0
    res = json.loads((root / "results.json").read_text())
    assert [p["label"] for p in res["points"]] == ["noise=0.0", "noise=1.0"]
    for p in res["points"]:
        assert [r["n_seeds"] for r in p["settings"]] == [2, 2]
        (e,) = p["effects"]
        assert (e["pair"], e["n"]) == ("single_dis - running_mean", 2)
    assert "| noise=1.0 | DIS | single_dis - running_mean | 2 |" in (root / "results.md").read_text()
    first = read_metrics(noisy)

    # interrupt one run after its step-20 checkpoint: no finish event, no step-30 checkpoint, metrics up to step 25
    ev = noisy / "events.log"
    ev.write_text("".join(l + "\n" for l in ev.read_text().splitlines() if l.split("\t")[1] != "finish"))
    checkpoints(noisy)[-1].unlink()
    (noisy / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in first[:25]))
    stamps = {d: (d / "run_setting.ipynb").stat().st_mtime_ns for d in runs if d != noisy}
    capsys.readouterr()

    assert sweep_main([str(SMOKE_SWEEP), "--out", str(tmp_path), "--jobs", "2"]) == 0
    assert "7 finished (skipped), 1 to resume" in capsys.readouterr().out
    assert {d: (d / "run_setting.ipynb").stat().st_mtime_ns for d in stamps} == stamps  # finished runs not re-run
    events = [l.split("\t")[1] for l in ev.read_text().splitlines()]
    assert events[-2:] == ["checkpoint", "finish"] and "resume" in events
    assert strip_perf(read_metrics(noisy)) == strip_perf(first)  # resumed exactly
    assert json.loads((root / "results.json").read_text())["points"] == res["points"]


def test_a_narrow_critic_starts_the_same_whether_the_warm_start_was_built_or_read(tmp_path, monkeypatch):
    "The critic's random initialisation does not depend on whether this process built the warm start or read it."
    monkeypatch.setenv("SAO_REPRO_CACHE", str(tmp_path / "cache"))  # empty: the first trainer builds the warm start
    cfg = smoke_cfg("sao", tmp_path / "a", critic_width=16)
    built, read = MiniTrainer(cfg, log=None), MiniTrainer(cfg, log=None)
    assert read.start_meta == built.start_meta
    a, b = built.critic.model.state_dict(), read.critic.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- bounded sweep loading
def test_billion_laughs_sweep_file_is_refused_before_it_expands(tmp_path, capsys):
    from sao_repro.mini.sweep import sweep_main

    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    (tmp_path / "lol.yaml").write_text("\n".join(lines + ["name: lol", "settings: [sao]", "seeds: 1", "steps: 1"]))
    assert sweep_main([str(tmp_path / "lol.yaml"), "--out", str(tmp_path)]) == 2
    assert "YAML aliases" in capsys.readouterr().err


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
