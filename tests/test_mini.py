"""CPU testbed (sao_repro.mini): task, smoke runs of every setting, exact resume, NaN stop, papermill, CLI errors."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from sao_repro.settings import get_setting, list_settings
from sao_repro.mini.task import TaskConfig, answer_reward, eval_problems, sample_problems
from sao_repro.mini.train import MiniTrainer, NonFiniteError, checkpoints, read_metrics, train_run
from sao_repro.metrics import run_flags
from sao_repro.runlog import read_events
from sao_repro.mini.cli import compare_main, make_config, run_main, run_setting
from mini_helpers import smoke_cache, smoke_cfg, strip_perf  # noqa: F401 (smoke_cache: an autouse fixture)
from tb_helpers import assert_tb_matches

CONTRACT_KEYS = [
    "step",
    "acc",
    "reward/mean",
    "dis/kept_frac",
    "dis/masked_below_frac",
    "dis/masked_above_frac",
    "adv/mean",
    "adv/std",
    "actor/loss",
    "actor/grad_norm",
    "rollout/policy_lag",
    "rollout/resp_len",
    "perf/step_s",
]


# ---------------------------------------------------------------- task
def test_task_schema_split_and_reward():
    cfg = TaskConfig(difficulty=3, ops="+-")
    tr = sample_problems(cfg, 300, "train", np.random.default_rng(5))
    assert tr == sample_problems(cfg, 300, "train", np.random.default_rng(5))
    ev = eval_problems(cfg)
    assert len(ev) == cfg.n_eval
    assert not {p["problem"] for p in tr} & {p["problem"] for p in ev}
    for p in tr[:20]:
        assert set(p) == {"problem", "solution", "level", "type"}
        assert p["level"] == "Level 3"
        gold = p["solution"].rsplit("\\boxed{", 1)[1].split("}")[0]
        assert answer_reward(gold, p["solution"]) == 1.0
        assert answer_reward(str(int(gold) + 1), p["solution"]) == 0.0


# ---------------------------------------------------------------- smoke run of every setting
@pytest.mark.parametrize("setting", list_settings())  # the comparison's five and the paper's ablation arms
def test_smoke_run_every_setting(setting, tmp_path):
    warmup = get_setting(setting).warmup_steps
    steps = warmup + 3 if warmup else 4  # sao and its arms: 10 critic-only warmup steps first
    cfg = smoke_cfg(setting, tmp_path, steps=steps)
    before = {k: v.clone() for k, v in torch.load(_start_weights(cfg), weights_only=True).items()}
    d = train_run(cfg, log=None)
    assert d == tmp_path / "mini" / setting / "seed0"
    ms = read_metrics(d)
    assert [m["step"] for m in ms] == list(range(1, steps + 1))
    for m in ms:
        for k in CONTRACT_KEYS:
            assert k in m, (setting, k)
        assert 0.0 <= m["acc"] <= 1.0
        assert m["rollout/policy_lag"] == min(3, m["step"] - 1)
    assert any("eval/acc" in m for m in ms)
    if get_setting(setting).critic:
        assert all("critic/value_loss" in m and "critic/explained_var" in m for m in ms)
        assert [m["actor/updated"] for m in ms] == [0] * 10 + [1] * 3
    # the policy moved away from the shared warm start
    after = torch.load(checkpoints(d)[-1], weights_only=False)["policy"]
    assert any(not torch.equal(before[k], after[k]) for k in before)
    events = [l.split("\t")[1] for l in (d / "events.log").read_text().splitlines()]
    assert events[0] == "start" and events[-1] == "finish" and "checkpoint" in events
    conf = json.loads((d / "config.json").read_text())
    assert (conf["setting"], conf["seed"], conf["backend"]) == (setting, 0, "mini")


def _start_weights(cfg):
    from sao_repro.mini.model import cache_root, start_key, warm_start

    warm_start(cfg.task(), cfg.model(), cfg.pretrain(), log=None)
    return cache_root() / "mini" / start_key(cfg.task(), cfg.model(), cfg.pretrain()) / "start.pt"


@pytest.mark.parametrize(
    "setting, kw",
    [
        ("grpo_dis", {}),
        ("grpo_dis", {"minibatches": 2}),
        ("grpo", {}),
        ("single_dis", {"dis_form": "decoupled"}),
        ("sao", {"warmup_steps": 1}),
    ],
)
def test_dis_metrics_measured_once_per_step(setting, kw, tmp_path, monkeypatch):
    "One `dis_metrics` call per step: the policy loss's own (one step on the whole batch), else the trainer's."
    import sao_repro.loss as L
    import sao_repro.mini.trainer as MT

    calls = []

    def counted(fn):
        def call(*a, **k):
            calls.append(tuple(a[2].shape))
            return fn(*a, **k)

        return call

    monkeypatch.setattr(L, "dis_metrics", counted(L.dis_metrics))
    monkeypatch.setattr(MT, "dis_metrics", counted(MT.dis_metrics))
    tr = MT.MiniTrainer(smoke_cfg(setting, tmp_path, **kw), log=None)
    for step in range(2):
        calls.clear()
        m = tr.train_step()
        assert len(calls) == 1 and calls[0][0] == 16, (step, calls)  # once, on the whole batch of 16 rows
        assert m["dis/kept_frac"] + m["dis/masked_below_frac"] + m["dis/masked_above_frac"] + m[
            "dis/nonfinite_frac"
        ] == pytest.approx(1.0)


def test_equal_trajectories_per_step(tmp_path):
    for s in ("grpo", "single_dis"):
        d = train_run(smoke_cfg(s, tmp_path, steps=1), log=None)
        m = read_metrics(d)[0]
        assert m["rollout/n_correct"] + m["rollout/n_incorrect"] == 16


# ---------------------------------------------------------------- resume equivalence and NaN stop
@pytest.mark.parametrize("setting", ["sao", "running_mean", "grpo_dis"])
def test_resume_after_crash_is_exact(setting, tmp_path):
    steps = 14
    nan_step = 12 if setting == "sao" else 9  # sao's policy updates start after 10 critic-only steps
    full = train_run(smoke_cfg(setting, tmp_path / "a", steps=steps, lag_mode="random"), log=None)
    # the same run, killed by a NaN: the last checkpoint before it is kept, later metrics were written
    crash = smoke_cfg(setting, tmp_path / "b", steps=steps, lag_mode="random", debug_nan_step=nan_step)
    with pytest.raises(NonFiniteError):
        train_run(crash, log=None)
    d = crash.run_dir()
    assert [m["step"] for m in read_metrics(d)][-1] == nan_step - 1
    assert checkpoints(d)[-1].name == f"step_{3 * ((nan_step - 1) // 3):06d}.pt"
    train_run(smoke_cfg(setting, tmp_path / "b", steps=steps, lag_mode="random"), resume=True, log=None)
    a, b = read_metrics(full), read_metrics(d)
    assert [m["step"] for m in b] == list(range(1, steps + 1))  # nothing lost or repeated
    assert strip_perf(a) == strip_perf(b)  # bit-for-bit the same metrics
    pa = torch.load(checkpoints(full)[-1], weights_only=False)
    pb = torch.load(checkpoints(d)[-1], weights_only=False)
    assert all(torch.equal(pa["policy"][k], pb["policy"][k]) for k in pa["policy"])
    events = [l.split("\t")[1] for l in (d / "events.log").read_text().splitlines()]
    assert "nan" in events and "resume" in events and events[-1] == "finish"
    # TensorBoard: the same scalars as metrics.jsonl, the crashed run's steps after its checkpoint replaced
    tags = ["eval/acc", "acc", "reward/mean", "rollout/n_correct", "actor/loss", "mismatch/lag_max"]
    tags += {"sao": ["critic/value_loss"], "grpo_dis": ["dis/masked_frac"], "running_mean": ["adv/mean"]}[setting]
    assert_tb_matches(full / "tensorboard", a, tags)
    assert len(list((d / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert_tb_matches(d / "tensorboard", b, tags)


def test_resume_with_more_steps_is_exact(tmp_path):
    "A finished 5-step run resumed to 10 steps equals an uninterrupted 10-step run."
    full = train_run(smoke_cfg("single_dis", tmp_path / "a", steps=10), log=None)
    part = train_run(smoke_cfg("single_dis", tmp_path / "b", steps=5), log=None)
    assert "eval/acc" in read_metrics(part)[-1]  # the last step of a run is evaluated
    train_run(smoke_cfg("single_dis", tmp_path / "b", steps=10), resume=True, log=None)
    assert strip_perf(read_metrics(full)) == strip_perf(read_metrics(part))
    assert json.loads((part / "config.json").read_text())["steps"] == 10
    got = assert_tb_matches(part / "tensorboard", read_metrics(part), ["eval/acc", "dis/masked_frac"])
    assert 5 not in got["eval/acc"]  # step 5's evaluation, dropped on resume, is dropped in TensorBoard too


def test_cli_nan_exit_code_and_resume(tmp_path, capsys):
    args = [
        "--setting",
        "grpo",
        "--out",
        str(tmp_path),
        "--steps",
        "6",
        "--smoke",
        "--ckpt-every",
        "2",
        "--eval-every",
        "2",
    ]
    # --smoke caps steps at 4; the NaN at step 3 stops the run before anything of step 3 is applied
    assert run_main(args + ["--debug-nan-step", "3"]) == 3
    d = tmp_path / "mini" / "grpo" / "seed0"
    assert "non-finite" in capsys.readouterr().err
    assert [p.name for p in checkpoints(d)] == ["step_000002.pt"]
    assert [m["step"] for m in read_metrics(d)] == [1, 2]
    nan = [l for l in (d / "events.log").read_text().splitlines() if l.split("\t")[1] == "nan"]
    assert len(nan) == 1 and json.loads(nan[0].split("\t")[2])["last_checkpoint"] == "step_000002.pt"
    assert run_main(args + ["--resume"]) == 0
    assert [m["step"] for m in read_metrics(d)] == [1, 2, 3, 4]


# ---------------------------------------------------------------- failure events: what the health flags read
def test_testbed_nan_stop_writes_the_event_the_nan_flag_reads(tmp_path):
    cfg = smoke_cfg("grpo", tmp_path, steps=3, debug_nan_step=2)
    with pytest.raises(NonFiniteError):
        train_run(cfg, log=None)
    d = cfg.run_dir()
    assert [m["step"] for m in read_metrics(d)] == [1]
    assert all(math.isfinite(v) for m in read_metrics(d) for v in m.values() if isinstance(v, float))  # no NaN written
    assert read_events(d)[-1]["event"] == "nan"
    f = run_flags(d)
    assert f["nan"] and not f["oom"] and not f["crashed"]  # from the event alone


def _cpu_alloc_failure():
    torch.empty(2**50)  # torch's CPU allocator refuses: a plain RuntimeError


def _cuda_oom():
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def _memory_error():
    raise MemoryError()


def _words():
    raise RuntimeError("the prompt said: CUDA out of memory, NaN, Traceback (most recent call last):")


@pytest.mark.parametrize(
    "fail, oom", [(_cuda_oom, True), (_memory_error, True), (_cpu_alloc_failure, True), (_words, False)]
)
def test_testbed_failure_at_a_step_writes_the_event_the_flags_read(tmp_path, monkeypatch, fail, oom):
    "Out of memory at a step ends the run with an `oom` event; any other exception with `error`: both are `crashed`."
    real = MiniTrainer.train_step

    def step(self):
        if self.step == 1:
            fail()
        return real(self)

    monkeypatch.setattr(MiniTrainer, "train_step", step)
    cfg = smoke_cfg("grpo", tmp_path, steps=3)
    with pytest.raises((MemoryError, RuntimeError)):
        train_run(cfg, log=None)
    ev = read_events(cfg.run_dir())[-1]
    assert (ev["event"], ev["details"]["step"]) == ("oom" if oom else "error", 2)
    f = run_flags(cfg.run_dir())
    assert f["crashed"] and f["oom"] == oom and not f["nan"]


# ---------------------------------------------------------------- CLI errors
@pytest.mark.parametrize("argv", [["--setting", "ppo"], ["--setting", "sao", "--backend", "gpu"]])
def test_run_unknown_names_list_valid_ones(argv, capsys):
    with pytest.raises(SystemExit) as e:
        run_main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err
    assert ("single_dis" in err) if "ppo" in argv else ("mini" in err and "areal" in err)


def test_compare_unknown_setting(capsys):
    with pytest.raises(SystemExit) as e:
        compare_main(["--settings", "sao", "ppo"])
    assert e.value.code == 2
    assert "running_mean" in capsys.readouterr().err


def test_compare_interrupted_exits_130_saying_how_to_resume_and_writes_no_summary(tmp_path, capsys, monkeypatch):
    import sao_repro.mini.compare as C  # compare_main looks up its runner there

    started = []

    def interrupted(a, ov, nb, todo, bar):
        started.extend(todo)
        raise KeyboardInterrupt  # Ctrl-C while the runs are going

    monkeypatch.setattr(C, "_compare_local", interrupted)
    monkeypatch.setattr(C, "prebuild_warm_start", lambda a, ov: None)
    rc = compare_main(["--settings", "sao", "grpo", "--seeds", "1", "--smoke", "--out", str(tmp_path)])
    assert rc == 130 and len(started) == 2
    err = capsys.readouterr().err
    assert "sao-repro compare: interrupted after" in err and "run the same command again" in err
    assert not (tmp_path / "mini" / "summary.md").exists()  # no table of runs that did not finish


def test_python_api_errors_list_names():
    with pytest.raises(ValueError, match="valid settings: sao, grpo"):
        run_setting("ppo")
    with pytest.raises(ValueError, match="valid backends: mini, areal"):
        run_setting("sao", backend="gpu")
    with pytest.raises(ValueError, match="unknown run option"):
        make_config("sao", overrides={"lgs": 1})


def test_areal_backend_goes_through_the_launcher(tmp_path, capsys, monkeypatch):
    try:
        import sao_repro.areal.launch as launch
    except ImportError:  # without the cluster launcher: a clear error naming it
        assert run_main(["--setting", "sao", "--backend", "areal", "--out", str(tmp_path)]) == 1
        assert "sao_repro.areal.launch" in capsys.readouterr().err
        return
    calls = []

    def fake(setting, seed=1, steps=None, out_dir=None, dry_run=False, extra_overrides=(), **kw):
        calls.append((setting, seed, steps, out_dir, dry_run, list(extra_overrides)))
        run_dir = Path(out_dir) / "areal" / setting / f"seed{seed}"
        return {
            "status": "dry-run" if dry_run else "failed",
            "returncode": 0 if dry_run else 1,
            "run_dir": str(run_dir),
        }

    monkeypatch.setattr(launch, "launch_setting", fake)
    d = run_setting(
        "grpo",
        seed=2,
        steps=7,
        backend="areal",
        out_dir=str(tmp_path),
        overrides={"dry_run": True, "extra_overrides": ["a=1"]},
    )
    assert d == tmp_path / "areal" / "grpo" / "seed2"
    assert calls == [("grpo", 2, 7, str(tmp_path), True, ["a=1"])]
    assert run_main(["--setting", "sao", "--backend", "areal", "--out", str(tmp_path)]) == 1  # a failed launch
    assert "cluster run failed" in capsys.readouterr().err
    with pytest.raises(ValueError, match="dry_run, extra_overrides"):
        run_setting("sao", backend="areal", overrides={"lag": 2})


# ---------------------------------------------------------------- papermill
def test_compare_papermill_smoke(tmp_path, capsys):
    "compare executes run_setting.ipynb per run, keeps it, goes on after a failure and prints the summary."
    # grpo's folder holds a partial run with another lag: its resume refuses the change, running_mean goes on
    run_setting("grpo", 0, 2, out_dir=str(tmp_path), smoke=True, overrides={"lag": 0}, log=None)
    rc = compare_main(
        ["--settings", "grpo", "running_mean", "--seeds", "1", "--smoke", "--out", str(tmp_path), "--jobs", "2"]
    )
    out = capsys.readouterr()
    assert rc == 1
    assert "failed: grpo seed0" in out.err
    ok = tmp_path / "mini" / "running_mean" / "seed0"
    nb = json.loads((ok / "run_setting.ipynb").read_text())
    src = "".join("".join(c["source"]) for c in nb["cells"])
    assert "smoke = True" in src and 'setting = "running_mean"' in src  # papermill's injected parameters
    assert any(o.get("output_type") == "display_data" for c in nb["cells"] for o in c.get("outputs", []))  # the curves
    assert [m["step"] for m in read_metrics(ok)] == [1, 2, 3, 4]
    assert (tmp_path / "mini" / "grpo" / "seed0" / "run_setting.ipynb").exists()  # the failed one is kept too
    assert "| running_mean | 1 |" in out.out and "| grpo | 1 |" in out.out  # grpo: the 2 steps it had before
    assert (tmp_path / "mini" / "summary.md").exists()


def test_run_setting_notebook_smoke(tmp_path):
    "The run notebook itself, executed by papermill with smoke=True, trains and draws its curves."
    from sao_repro.mini.cli import find_run_notebook
    from sao_repro.report import run_notebook

    out_nb = tmp_path / "executed.ipynb"
    run_notebook(
        find_run_notebook(), out_nb, {"setting": "grpo_dis", "seed": 3, "smoke": True, "out_dir": str(tmp_path)}
    )
    d = tmp_path / "mini" / "grpo_dis" / "seed3"
    assert [m["step"] for m in read_metrics(d)] == [1, 2, 3, 4]
    assert json.loads((d / "config.json").read_text())["preset"] == "smoke"
    nb = json.loads(out_nb.read_text())
    assert any(o.get("output_type") == "display_data" for c in nb["cells"] for o in c.get("outputs", []))


# ---------------------------------------------------------------- knobs: advantage whitening


def test_adv_whiten_leaves_the_critic_loss_identical(tmp_path):
    "Whitened advantages (mean 0, std 1 over action tokens); the critic's targets, loss and grad norm are untouched."
    import sao_repro.mini.train as MT

    out = {}
    for w in (False, True):
        tr = MT.MiniTrainer(smoke_cfg("sao", tmp_path / str(w), warmup_steps=0, adv_whiten=w), log=None)
        assert tr.setting.adv_whiten is w
        out[w] = tr.train_step()  # step 1: same rollout, same critic; the policy updates after the critic
    for k in ("critic/value_loss", "critic/grad_norm", "critic/explained_var", "critic/returns_std"):
        assert out[True][k] == out[False][k], k
    assert out[True]["adv/mean"] == pytest.approx(0.0, abs=1e-5) and out[True]["adv/std"] == pytest.approx(
        1.0, abs=1e-3
    )
    assert abs(out[False]["adv/std"] - 1.0) > 1e-2  # the unwhitened advantages were not already whitened
    assert out[True]["actor/loss"] != out[False]["actor/loss"]


# ---------------------------------------------------------------- the paper's ablation arms


def test_ablation_arms_are_sao_less_one_component(tmp_path):
    """vapo, sao_k1 and sao_frozen differ from sao in one field each, and the testbed realises it: vapo masks no
    token and keeps no DIS band, sao_k1 takes one critic pass per step, sao_frozen's critic keeps its attention."""
    import sao_repro.mini.train as MT
    from dataclasses import asdict

    sao = asdict(get_setting("sao"))
    diff = {
        s: {k: v for k, v in asdict(get_setting(s)).items() if sao[k] != v and k not in ("name", "role", "group")}
        for s in list_settings("ablation")
    }
    assert diff == {
        "vapo": {"dis_band": None, "dis_preset": None},
        "sao_k1": {"critic_k": 1},
        "sao_frozen": {"critic_freeze": "attention"},
    }
    assert list_settings("comparison") == ["sao", "grpo", "grpo_dis", "running_mean", "single_dis"]
    trainers = {s: MT.MiniTrainer(smoke_cfg(s, tmp_path / s, warmup_steps=1), log=None) for s in diff}
    assert [trainers[s].critic.k_passes for s in diff] == [2, 1, 2]
    crit = trainers["sao_frozen"].critic
    before = {n: p.detach().clone() for n, p in crit.model.named_parameters()}
    assert crit.frozen and not trainers["sao_k1"].critic.frozen and not trainers["vapo"].critic.frozen
    for _ in range(3):  # one critic-only step, then two with a policy update
        ms = {s: tr.train_step() for s, tr in trainers.items()}
    assert all(torch.equal(before[n], p) for n, p in crit.model.named_parameters() if n in crit.frozen)
    assert trainers["vapo"].setting.band is None and ms["vapo"]["dis/kept_frac"] == 1.0
    assert all(m["actor/updated"] == 1 for m in ms.values())


# ---------------------------------------------------------------- knobs: frozen-attention critic


def test_frozen_attention_critic(tmp_path):
    "critic_freeze=attention: after K updates per step the attention weights are bit-identical, MLP and head moved, no optimizer state for them."
    import sao_repro.mini.train as MT

    tr = MT.MiniTrainer(smoke_cfg("sao", tmp_path, critic_freeze="attention"), log=None)
    crit = tr.critic
    before = {n: p.detach().clone() for n, p in crit.model.named_parameters()}
    frozen = set(crit.frozen)
    assert frozen and all((".qkv." in n or ".proj." in n) for n in frozen)
    for _ in range(2):
        tr.train_step()  # warmup steps: K=2 critic passes each
    after = dict(crit.model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in frozen)
    assert not torch.equal(before["value_head.weight"], after["value_head.weight"])
    assert not torch.equal(before["trunk.blocks.0.mlp.0.weight"], after["trunk.blocks.0.mlp.0.weight"])
    held = {id(p) for p in crit.opt.state}
    assert not any(id(after[n]) in held for n in frozen) and id(after["value_head.weight"]) in held
    assert all(id(p) not in {id(after[n]) for n in frozen} for g in crit.opt.param_groups for p in g["params"])


def test_freeze_pattern_matching_nothing_names_the_modules():
    from sao_repro.critic import freeze_params

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    with pytest.raises(ValueError, match=r"match no parameter; modules seen: 0, 2"):
        freeze_params(model, "attention")
    assert freeze_params(model, "none") == [] and all(p.requires_grad for p in model.parameters())


# ---------------------------------------------------------------- knobs: critic warm start


def test_critic_init_from_an_earlier_run(tmp_path):
    "critic_init: the earlier run's critic weights are loaded, the source recorded in config.json; wrong shapes are refused."
    import sao_repro.mini.train as MT

    first = train_run(smoke_cfg("sao", tmp_path / "a", steps=3), log=None)
    saved = torch.load(checkpoints(first)[-1], weights_only=True)["critic"]["model"]
    tr = MT.MiniTrainer(smoke_cfg("sao", tmp_path / "b", critic_init=str(first)), log=None)
    assert all(torch.equal(v, saved[k]) for k, v in tr.critic.model.state_dict().items())
    cold = MT.MiniTrainer(smoke_cfg("sao", tmp_path / "c"), log=None)
    assert not torch.equal(cold.critic.model.value_head.weight, saved["value_head.weight"])
    d = train_run(smoke_cfg("sao", tmp_path / "b", steps=1, critic_init=str(first)), log=None)
    src = json.loads((d / "config.json").read_text())["critic_source"]
    assert src["path"] == str(checkpoints(first)[-1].resolve()) and src["step"] == 3 and len(src["sha256"]) == 64
    with pytest.raises(ValueError, match="shapes differ"):
        MT.MiniTrainer(smoke_cfg("sao", tmp_path / "e", critic_width=16, critic_init=str(first)), log=None)
    with pytest.raises(ValueError, match="has no critic"):
        MT.MiniTrainer(
            smoke_cfg(
                "sao", tmp_path / "f", critic_init=str(train_run(smoke_cfg("grpo", tmp_path / "g", steps=1), log=None))
            ),
            log=None,
        )


# ---------------------------------------------------------------- knobs: DIS band presets


def test_dis_band_preset_reaches_the_loss_and_config_json(tmp_path, monkeypatch):
    "dis_band=paper-math: the trainer's loss gets [0.7, 6.0]; config.json records the resolved band and the preset."
    import sao_repro.mini.trainer as MT

    seen = []
    real = MT.policy_loss
    monkeypatch.setattr(MT, "policy_loss", lambda *a, **kw: seen.append(kw["band"]) or real(*a, **kw))
    d = train_run(smoke_cfg("single_dis", tmp_path, steps=1, dis_band="paper-math"), log=None)
    assert seen and set(seen) == {(0.7, 6.0)}
    conf = json.loads((d / "config.json").read_text())
    assert conf["dis_band"] == "paper-math"
    assert (conf["setting_spec"]["dis_band"], conf["setting_spec"]["dis_preset"]) == ([0.7, 6.0], "paper-math")
    with pytest.raises(ValueError, match="reference, paper-math, paper-coding"):
        smoke_cfg("single_dis", tmp_path / "x", dis_band="[0.7, 6]")


def test_compare_ends_with_one_table_and_records_it(tmp_path, capsys, monkeypatch):
    "compare over finished runs: one table (held-out start -> end per setting, then each verdict with what would resolve it), the rest in summary.md; --record saves that table as a results file."
    import fake_testbed
    import sao_repro.mini.compare as C  # compare_main looks up _compare_state there
    from sao_repro.results import load, render, status

    settings = ["sao", "grpo", "grpo_dis", "running_mean", "single_dis"]
    fake_testbed.main(
        [
            "--out",
            str(tmp_path),
            "--runs",
            ",".join(f"{s}:{k}" for s in settings for k in range(3)),
            "--steps",
            "40",
            "--interval",
            "0",
        ]
    )
    monkeypatch.setattr(C, "_compare_state", lambda a, ov, s, k: "done")  # the fake runs count as finished
    rec = tmp_path / "results" / "study.json"
    argv = ["--seeds", "3", "--out", str(tmp_path), "--window", "10", "--record", str(rec)]
    assert compare_main(argv) == 0
    out = capsys.readouterr().out
    table = out[out.index("### The study") : out.index("recorded:")].strip()
    lines = table.splitlines()
    assert sum(line.startswith("|---") for line in lines) == 1  # one table
    assert [line.split(" | ")[0] for line in lines[4:9]] == [f"| {s}" for s in settings]
    assert all(" | 3 | " in line and " -> " in line for line in lines[4:9])  # held-out step 1 -> end, 3 seeds
    verdicts = [line.split(" | ") for line in lines[9:]]
    assert len(verdicts) == 6 and all(v[0].startswith("| **") for v in verdicts)
    assert all(v[3] in ("reproduced", "opposite", "not resolved") for v in verdicts)
    open_ = [v for v in verdicts if v[3] == "not resolved"]
    assert open_ and all("SEEDS=" in v[4] for v in open_)  # each unresolved one names what would resolve it
    assert all(v[4] == "- |" for v in verdicts if v[3] != "not resolved")
    assert "--ray" in table or all("`make study SEEDS=5`" in v[4] or "near 0" in v[4] for v in open_)
    summ = (tmp_path / "mini" / "summary.md").read_text()
    assert summ.startswith(f"`sao-repro compare --seeds 3 --out {tmp_path}") and table in summ
    assert (
        "### Paired effects" in summ
        and "### End accuracy" in summ
        and "| point |" not in summ
        and "| study |" not in summ
    )
    r = load(rec)
    assert r["markdown"].strip() == table and r["command"] == "sao-repro compare " + " ".join(argv)
    assert status(r) == "fresh" and "Stale" not in render(r)
