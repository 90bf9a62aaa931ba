"""sao_repro.mini.cli, the testbed command line. It is `MiniRunConfig`: every field is a flag of `sao-repro run` (and of
`compare`), every sweep key is a field, and a bad choice is refused with exit 2 naming the choices (also
sao_repro.mini.sweep). Bad numbers and counts exit 2 before any folder is made, `compare` skips finished runs, and a
full disk is named as such."""

import os
import re
import shlex
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Literal, get_args, get_origin, get_type_hints

import pytest
import yaml

import sao_repro.mini.cli as mcli
import sao_repro.mini.runner as runner  # run_setting looks up train_run and _run_areal there
from sao_repro.cli import main
from sao_repro.mini.cli import compare_main, run_main
from sao_repro.mini.config import MiniRunConfig
from sao_repro.mini.sweep import load_sweep
from mini_helpers import smoke_cache  # noqa: F401 (an autouse fixture)
from run_tools import _run_args, cli, snapshot

REPO = Path(__file__).resolve().parent.parent
HINTS = get_type_hints(MiniRunConfig)
FIELDS = [f.name for f in fields(MiniRunConfig)]
# values the generic rule below cannot pick (no default to step from, or a constrained string)
OTHER = {
    "setting": "grpo",
    "ops": "+-",
    "out": "elsewhere",
    "warmup_steps": 5,
    "critic_k": 3,
    "critic_width": 32,
    "policy_lambda": 0.9,
    "sft_noise": 0.2,
    "debug_nan_step": 2,
    "adv_whiten": True,
    "critic_freeze": "attention",
    "critic_init": "elsewhere/run",
    "dis_band": "paper-math",
}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def literal_choices(tp):
    return get_args(tp) if get_origin(tp) is Literal else None


def other_value(name: str):
    "A valid value of field NAME that is not its default."
    if name in OTHER:
        return OTHER[name]
    default = getattr(MiniRunConfig(), name)
    if literal_choices(HINTS[name]):
        return next(c for c in literal_choices(HINTS[name]) if c != default)
    assert type(default) in (int, float), f"{name}: add a non-default value to OTHER"
    return default + 1 if type(default) is int else default + 0.5


@pytest.fixture(scope="module")
def critic_file(tmp_path_factory):
    "A `critic_init` that loads into a run of `cfg`: a critic state_dict of its shapes (the run reads it before it starts)."
    import torch
    from sao_repro.mini.critic_init import critic_model
    from sao_repro.mini.model import PolicyModel

    root = tmp_path_factory.mktemp("critics").resolve()

    def make(cfg: MiniRunConfig) -> str:
        p = root / f"critic{len(list(root.iterdir()))}.pt"
        torch.save(critic_model(cfg, PolicyModel(cfg.model()), 0.0).state_dict(), p)
        return str(p)

    return make


@pytest.fixture
def captured(monkeypatch):
    "Run `sao-repro run` up to the config it would train (or the cluster launch it would make), without training."
    seen = {}
    monkeypatch.setattr(runner, "train_run", lambda cfg, **kw: seen.setdefault("config", cfg) and Path(cfg.out))
    monkeypatch.setattr(mcli, "read_metrics", lambda d: [])
    monkeypatch.setattr(runner, "_run_areal", lambda *a: seen.setdefault("areal", a) and Path("."))
    return seen


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_reaches_sao_repro_run(name, captured, critic_file):
    value = critic_file(MiniRunConfig()) if name == "critic_init" else other_value(name)
    assert value != getattr(MiniRunConfig(), name)
    argv = ["run", *(["--setting", "sao"] if name != "setting" else []), flag(name), str(value)]
    assert main(argv) == 0
    if name == "backend":  # the cluster backend goes to its launcher
        assert captured["areal"][0] == "sao"
        return
    assert getattr(captured["config"], name) == value


@pytest.mark.parametrize("name", [n for n in FIELDS if n not in ("setting", "seed")])
def test_every_field_but_setting_and_seed_is_a_compare_option(name):
    value = other_value(name)
    a, ov = mcli.compare_options([flag(name), str(value)])
    assert getattr(a, name) == value
    assert name in ("steps", "backend", "out") or ov == {name: value}  # the others reach every run as overrides


def test_help_lists_every_field_once(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in FIELDS:
        assert len(re.findall(rf"{re.escape(flag(name))}\b(?!-)", out)) == 1, name
    for f in fields(MiniRunConfig):  # the help is the field's own (its first words; the box wraps the rest)
        assert " ".join(f.metadata["help"].split()[:2]) in " ".join(out.split()), f.name


def test_smoke_defaults_and_the_study_flags():
    "The Makefile's study flags parse; with --smoke only what differs from the smoke preset is an override."
    study = re.search(r"^STUDY \?= (.*)$", (REPO / "Makefile").read_text(), re.M).group(1)
    a, ov = mcli.compare_options(["--seeds", "3", "--out", "runs", "--jobs", "2", *shlex.split(study)])
    assert (a.seeds, a.out, a.jobs) == (3, "runs", 2)
    assert ov == {"family": "chain", "ops": "+-", "difficulty": 1, "lr": 2e-4}  # min/max terms 2/4 are the defaults
    a, ov = mcli.run_options(["--setting", "grpo", "--smoke", "--eval-every", "2", "--lag", "0"])
    assert (a.preset, a.eval_every, a.steps, ov) == ("smoke", 2, 4, {"lag": 0})
    assert mcli.run_options(["--setting", "sao"])[0].steps == MiniRunConfig.steps


# ---------------------------------------------------------------- sweep keys
@pytest.mark.parametrize("path", sorted((REPO / "configs" / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_sweep_keys_are_run_options(path):
    d = yaml.safe_load(path.read_text())
    keys = set(d.get("base", {})) | set(d.get("grid", {}))
    assert keys <= set(FIELDS), sorted(keys - set(FIELDS))
    load_sweep(path)  # and every point builds


@pytest.mark.parametrize("part", ["base", "grid"])
def test_sweep_unknown_key_is_refused_by_name(part):
    d = {"name": "x", "settings": ["sao"], "seeds": 1, "steps": 2, part: {"lrr": [1] if part == "grid" else 1}}
    with pytest.raises(ValueError, match=r"unknown run option\(s\) \['lrr'\]"):
        load_sweep(d)


def test_sweep_bad_choice_names_the_choices():
    with pytest.raises(ValueError, match="family='tree': use one of add, chain"):
        load_sweep({"name": "x", "settings": ["sao"], "seeds": 1, "steps": 2, "grid": {"family": ["chain", "tree"]}})


# ---------------------------------------------------------------- bad choices
@pytest.mark.parametrize("name", [n for n in FIELDS if literal_choices(HINTS[n])])
def test_bad_choice_exits_2_naming_the_choices(name, capsys, tmp_path):
    for argv in (["run", "--setting", "sao"], ["compare"]):
        with pytest.raises(SystemExit) as e:
            main([*argv, "--out", str(tmp_path / "o"), flag(name), "nope"])
        assert e.value.code == 2
        err = " ".join(capsys.readouterr().err.split())
        assert flag(name) in err and "nope" in err
        assert all(repr(c) in err for c in literal_choices(HINTS[name])), err
    with pytest.raises(ValueError, match=f"{name}='nope': use one of {', '.join(literal_choices(HINTS[name]))}"):
        MiniRunConfig(**{name: "nope"})  # the same check from Python, a sweep file or a notebook
    assert not (tmp_path / "o").exists()


def test_bad_choice_exit_code_of_the_command():
    "The real `sao-repro run` process: exit 2, the option and its choices on stderr, no traceback."
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(
        [sys.executable, "-m", "sao_repro.cli", "run", "--setting", "sao", "--lag-mode", "sometimes"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 2
    assert "--lag-mode" in p.stderr and "'fixed'" in p.stderr and "'random'" in p.stderr and "Traceback" not in p.stderr


def test_the_reports_run_command_reproduces_the_config(captured, critic_file):
    "The `sao-repro run` line the report prints for a run folder parses back to that run's config."
    from dataclasses import asdict, replace
    from sao_repro.report.text import run_command

    cfg = MiniRunConfig(
        **{n: other_value(n) for n in FIELDS if n not in ("setting", "backend", "threads", "critic_init")}
    )
    cfg = replace(cfg, critic_init=critic_file(cfg))
    assert main(shlex.split(run_command(asdict(cfg)))[1:]) == 0
    assert asdict(captured["config"]) == asdict(cfg)


# ---------------------------------------------------------------- one spelling per knob, old spellings still read
OLD = {"critic_warmup": ("warmup_steps", 4), "traj_per_step": ("trajectories_per_step", 16), "eval_n": ("n_eval", 32)}


@pytest.mark.parametrize("old", list(OLD))
def test_an_old_flag_spelling_reaches_the_renamed_option(old, captured):
    new, value = OLD[old]
    assert main(["run", "--setting", "sao", flag(old), str(value)]) == 0
    assert getattr(captured["config"], new) == value
    captured.clear()
    assert main(["run", "--setting", "sao", f"{flag(old)}={value}"]) == 0  # the --flag=value form too
    assert getattr(captured["config"], new) == value


def test_help_shows_only_the_new_spellings(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    for old, (new, _) in OLD.items():
        assert flag(new) in out and flag(old) not in out


def test_old_spellings_in_a_sweep_config_json_and_keyword_arguments():
    d = {
        "name": "x",
        "settings": ["sao"],
        "seeds": 1,
        "steps": 2,
        "base": {"traj_per_step": 16},
        "grid": {"eval_n": [8]},
    }
    sw = load_sweep(d)
    assert sw.base == {"trajectories_per_step": 16} and sw.grid == {"n_eval": [8]}
    cfg = MiniRunConfig.from_dict({"setting": "sao", "critic_warmup": 2, "traj_per_step": 8})
    assert (cfg.warmup_steps, cfg.trajectories_per_step, cfg.critic_warmup) == (2, 8, 2)
    assert MiniRunConfig(eval_n=7).n_eval == 7
    with pytest.raises(ValueError, match="give n_eval only"):
        MiniRunConfig.from_dict({"eval_n": 7, "n_eval": 8})


def test_resume_compares_a_config_saved_under_old_spellings():
    from sao_repro.mini.runfolder import config_changes

    cfg = MiniRunConfig(setting="sao", trajectories_per_step=16)
    saved = {k: v for k, v in vars(cfg).items()}
    saved["traj_per_step"] = saved.pop("trajectories_per_step")
    assert config_changes(saved, cfg) == []
    saved["traj_per_step"] = 32  # a real change, saved under the old name, is still seen
    assert [c["key"] for c in config_changes(saved, cfg)] == ["trajectories_per_step"]


# ---------------------------------------------------------------- compare skips finished runs
@pytest.mark.slow
def test_compare_skips_finished_runs_and_refuses_nothing_silently(tmp_path, capsys):
    args = ["--settings", "grpo", "--seeds", "1", "--steps", "2", "--smoke", "--out", str(tmp_path), "--jobs", "1"]
    assert compare_main(args) == 0
    d = tmp_path / "mini" / "grpo" / "seed0"
    before = snapshot(d)
    capsys.readouterr()
    assert compare_main(args) == 0
    assert "1 finished run(s) skipped" in capsys.readouterr().out
    assert snapshot(d) == before


# ---------------------------------------------------------------- bad numbers and counts
@pytest.mark.parametrize(
    "bad",
    [["--lr", "-1"], ["--noise", "nan"], ["--critic-lr", "inf"], ["--steps", "0"], ["--lag", "-2"], ["--n-eval", "0"]],
)
def test_bad_numbers_exit_2_before_any_folder(bad, tmp_path, capsys):
    assert run_main(["--setting", "sao", "--out", str(tmp_path / "o"), *bad]) == 2
    err = capsys.readouterr().err
    assert bad[0].lstrip("-").replace("-", "_") + "=" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("bad", [["--seeds", "0"], ["--jobs", "0"], ["--window", "0"], ["--steps", "-1"]])
def test_compare_bad_counts_exit_2(bad, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        compare_main(["--out", str(tmp_path / "o"), *bad])
    assert e.value.code == 2 and "must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- a full disk during a run
@pytest.fixture
def tiny_disk(tmp_path):
    "A 700 KB tmpfs: room for the logs and one smoke checkpoint, not two."
    d = tmp_path / "disk"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700k", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("mount (tmpfs) is not available here")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.mark.slow
def test_full_disk_says_so_and_names_the_folder(tiny_disk):
    p = cli("run", *_run_args(tiny_disk, 6, "--ckpt-every", "1"))
    out, err = p.communicate(timeout=300)
    d = tiny_disk / "mini" / "grpo" / "seed0"
    assert p.returncode == 1, err
    assert "disk full" in err and str(d) in err and "--resume" in err, err
    assert "enforce fail" not in err and "Traceback" not in err
    assert not list((d / "checkpoints").glob("*.tmp"))  # the partial checkpoint does not hold the space
