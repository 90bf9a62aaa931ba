"""What a testbed run reads (sao_repro.mini.inputs): `critic_init` resolved from the current folder and checked before
any run starts or any run folder is made, in `run`, `compare` and `sweep`; a knob of a part a setting lacks left out
for it with a note (`compare`) or refused (`run`), never recorded; the input files shipped with a Ray task, read from
its copy, recorded under the user's paths, and its run folder given the modes of a local one."""

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from sao_repro.files import current_umask
from sao_repro.mini.cli import (
    compare_main,
    compare_options,
    find_run_notebook,
    make_config,
    run_main,
    run_params,
    run_setting,
)
from sao_repro.mini.raytasks import run_task, start_blobs, unpack_into
from sao_repro.mini.critic_init import critic_model
from sao_repro.mini.inputs import pack_inputs
from sao_repro.mini.model import PolicyModel
from sao_repro.mini.sweep import sweep_main
from sao_repro.mini.train import checkpoints, read_metrics
from sao_repro.safeload import load_state
from mini_helpers import modes, smoke_cache, strip_perf  # noqa: F401 (smoke_cache: an autouse fixture)

SMOKE = {
    "preset": "smoke",
    "difficulty": 1,
    "trajectories_per_step": 16,
    "n_eval": 32,
    "eval_every": 2,
    "ckpt_every": 2,
}


def save_critic(path, cfg=None, nan=False):
    "A critic state_dict of the smoke sao run's shapes (NaN in its value head with `nan`)."
    cfg = cfg or make_config("sao", smoke=True)
    sd = critic_model(cfg, PolicyModel(cfg.model()), 0.0).state_dict()
    if nan:
        sd["value_head.bias"] = torch.full_like(sd["value_head.bias"], float("nan"))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(sd, path)
    return Path(path)


def one_line(err: str) -> str:
    assert err.strip() and "\n" not in err.strip() and "Traceback" not in err, err
    return err.strip()


# ---------------------------------------------------------------- run
@pytest.mark.parametrize("case", ["missing", "empty", "no_checkpoints", "nan", "shape"])
def test_run_refuses_a_critic_init_it_cannot_use_before_any_folder(case, tmp_path, capsys, monkeypatch):
    "Exit 2, one line naming critic_init and the file (a relative path taken from the current folder), no run folder."
    monkeypatch.chdir(tmp_path)
    rel = {
        "missing": "nowhere/run",
        "empty": "empty.pt",
        "no_checkpoints": "a_run",
        "nan": "nan.pt",
        "shape": "critic.pt",
    }[case]
    if case == "empty":
        Path(rel).write_bytes(b"")
    elif case == "no_checkpoints":
        Path(rel).mkdir()
    elif case in ("nan", "shape"):
        save_critic(rel, nan=case == "nan")
    extra = ["--critic-width", "16"] if case == "shape" else []
    rc = run_main(["--setting", "sao", "--smoke", "--out", "out", "--critic-init", rel, *extra])
    err = one_line(capsys.readouterr().err)
    assert rc == 2 and f"critic_init={tmp_path / rel}" in err
    assert {
        "missing": "no such file or run folder",
        "empty": "not a readable checkpoint",
        "no_checkpoints": "no checkpoints/step_*.pt",
        "nan": "non-finite critic weights",
        "shape": "shapes differ",
    }[case] in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["--setting", "grpo", "--critic-freeze", "attention"],
            "critic_freeze='attention': setting 'grpo' has no critic",
        ),
        (["--setting", "running_mean", "--critic-init", "CRITIC"], "setting 'running_mean' has no critic"),
        (["--setting", "grpo", "--dis-band", "paper-math"], "dis_band='paper-math': setting 'grpo' has no DIS band"),
    ],
)
def test_run_refuses_a_knob_its_setting_has_no_part_for(argv, said, tmp_path, capsys):
    critic = save_critic(tmp_path / "critic.pt")
    rc = run_main([*[str(critic) if a == "CRITIC" else a for a in argv], "--smoke", "--out", str(tmp_path / "out")])
    err = one_line(capsys.readouterr().err)
    assert rc == 2 and said in err and "pick a setting with one" in err
    assert not (tmp_path / "out").exists()


def test_a_nan_stop_says_whether_a_checkpoint_was_kept(tmp_path, capsys):
    base = ["--setting", "grpo", "--smoke", "--ckpt-every", "2", "--eval-every", "2"]
    assert run_main([*base, "--out", str(tmp_path / "a"), "--debug-nan-step", "1"]) == 3
    err = capsys.readouterr().err
    assert "no checkpoint was written before it" in err and "checkpoint kept" not in err
    assert not checkpoints(tmp_path / "a" / "mini" / "grpo" / "seed0")
    assert run_main([*base, "--out", str(tmp_path / "b"), "--debug-nan-step", "3"]) == 3
    assert "(last good checkpoint kept: step_000002.pt)" in capsys.readouterr().err


# ---------------------------------------------------------------- compare
@pytest.mark.parametrize(
    "bad, said",
    [
        (["--dis-band", "wide"], "dis_band"),
        (["--lr", "nan"], "lr=nan"),
        (["--critic-init", "nowhere"], "critic_init="),
        (["--trajectories-per-step", "12"], "group size 8"),
        (
            ["--settings", "grpo", "running_mean", "--critic-freeze", "attention"],
            "settings grpo, running_mean have no critic",
        ),
        (["--settings", "running_mean", "--dis-band", "paper-math"], "setting running_mean has no DIS band to replace"),
    ],
)
def test_compare_refuses_a_bad_option_before_any_run(bad, said, tmp_path, capsys, monkeypatch):
    "As run and sweep do: exit 2, one line, no run folder (not five runs that each fail)."
    import sao_repro.mini.compare as C  # compare_main looks up its runner there

    monkeypatch.setattr(C, "_compare_local", lambda *a: pytest.fail("a run started"))
    monkeypatch.chdir(tmp_path)
    rc = compare_main(["--seeds", "1", "--smoke", "--out", "o", *bad])
    err = one_line(capsys.readouterr().err)
    assert rc == 2 and err.startswith("sao-repro compare: error:") and said in err
    assert not (tmp_path / "o").exists()


def test_compare_plans_a_band_for_the_settings_with_one():
    "compare --dis-band paper-math over the five settings: the three with DIS get it, grpo and running_mean are named."
    from sao_repro.mini.cli import _compare_plan

    ovs, notes = _compare_plan(*compare_options(["--smoke", "--dis-band", "paper-math"]))
    assert {s: ov.get("dis_band") for s, ov in ovs.items()} == {
        "sao": "paper-math",
        "grpo": None,
        "grpo_dis": "paper-math",
        "running_mean": None,
        "single_dis": "paper-math",
    }
    assert notes == [
        "--dis-band paper-math: applied to sao, grpo_dis, single_dis; skipped for grpo, running_mean "
        "(no DIS band to replace)"
    ]


@pytest.mark.slow
def test_compare_applies_knobs_where_they_fit_and_records_them_nowhere_else(tmp_path, capsys, monkeypatch):
    "A relative critic_init (from the current folder), a band and a frozen critic reach sao; running_mean runs without them."
    monkeypatch.chdir(tmp_path)
    first = run_setting("sao", 0, 2, out_dir="first", smoke=True, log=None)
    rc = compare_main(
        [
            "--settings",
            "sao",
            "running_mean",
            "--seeds",
            "1",
            "--smoke",
            "--out",
            "out",
            "--dis-band",
            "paper-math",
            "--critic-init",
            str(first),
            "--critic-freeze",
            "attention",
        ]
    )
    out = capsys.readouterr().out
    src = (tmp_path / first).resolve()
    notes = [
        "--dis-band paper-math: applied to sao; skipped for running_mean (no DIS band to replace)",
        f"--critic-init {src}: applied to sao; skipped for running_mean (no critic)",
        "--critic-freeze attention: applied to sao; skipped for running_mean (no critic)",
    ]
    assert rc == 0 and all(n in out for n in notes), out
    assert all(n in (tmp_path / "out" / "mini" / "summary.md").read_text() for n in notes)
    sao, rm = (
        json.loads((tmp_path / "out" / "mini" / s / "seed0" / "config.json").read_text())
        for s in ("sao", "running_mean")
    )
    assert (sao["dis_band"], sao["critic_init"], sao["critic_freeze"]) == ("paper-math", str(src), "attention")
    assert sao["critic_source"]["path"] == str(src / "checkpoints" / "step_000002.pt")
    assert (sao["setting_spec"]["dis_preset"], sao["setting_spec"]["critic_freeze"]) == ("paper-math", "attention")
    assert (rm["dis_band"], rm["critic_init"], rm["critic_freeze"], rm["critic_source"]) == (None, None, None, None)


# ---------------------------------------------------------------- sweep
@pytest.mark.parametrize("value, said", [("missing/run", "no such file or run folder"), ("nan.pt", "non-finite")])
def test_a_sweep_refuses_a_bad_critic_init_before_any_run_folder(value, said, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_critic("nan.pt", nan=True)
    Path("w.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "w",
                "settings": ["sao"],
                "seeds": 2,
                "steps": 2,
                "base": SMOKE,
                "grid": {"critic_init": [None, value]},
            }
        )
    )
    rc = sweep_main(["w.yaml", "--out", "out"])
    err = one_line(capsys.readouterr().err)
    assert rc == 2 and f"critic_init={tmp_path / value}" in err and said in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- a Ray task (called here, outside Ray)
def test_a_task_reads_its_shipped_critic_and_records_the_users_paths(tmp_path):
    "The task reads the packed copy (the original is gone), records the user's out and critic, equals a local run; its folder comes back with this process's modes."
    src = run_setting("sao", 0, 2, out_dir=str(tmp_path / "first"), overrides=SMOKE, log=None)
    ov = {**SMOKE, "critic_init": str(src)}
    local = run_setting("sao", 1, 4, out_dir=str(tmp_path / "local"), overrides=ov, log=None)
    cfg = make_config("sao", 1, 4, overrides=ov)
    ((key, start),) = start_blobs([cfg], log=None).items()
    shipped = pack_inputs(cfg)
    src.rename(tmp_path / "moved")  # the task cannot read it where the driver did
    user_out = tmp_path / "user"
    umask = os.umask(0o077)  # as a Ray worker's: its files 0600, its folders 0700
    try:
        r = run_task(
            find_run_notebook().read_text(),
            run_params("sao", 1, 4, "mini", str(user_out), False, ov),
            None,
            (key, start),
            shipped,
        )
    finally:
        os.umask(umask)
    assert r["error"] is None, r["error"]
    back = unpack_into(r["folder"], tmp_path / "back")
    assert not user_out.exists() and not src.exists()
    conf, ref = (json.loads((d / "config.json").read_text()) for d in (back, local))
    assert (conf["out"], conf["critic_init"]) == (str(user_out), str(src))
    assert conf["critic_source"] == ref["critic_source"] and conf["critic_source"]["path"] == str(
        src / "checkpoints" / "step_000002.pt"
    )
    assert load_state(checkpoints(back)[-1], "test")["config"]["out"] == str(user_out)
    assert strip_perf(read_metrics(back)) == strip_perf(read_metrics(local))
    u = current_umask()
    assert set(modes(back).values()) == {0o777 & ~u, 0o666 & ~u}  # not the worker's 0700 / 0600
    assert {k: v for k, v in modes(back).items() if k != "run_setting.ipynb"} == modes(local)  # as a local run's
