"""sao_repro.areal.launch, the cluster launch glue: GPU preflight on recorded nvidia-smi outputs (Python and bash agree),
the launch plan with a mocked runner, `areal-config` and `launch --dry-run` for every setting (a bad config: one
message, exit 2), the scripts."""

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sao_repro.settings import list_settings

from sao_repro.areal.launch import (
    classify_gpus,
    run_preflight,
    launch_plan,
    execute_plan,
    launch_main,
    areal_config_main,
    launch_setting,
    is_finished,
    SETTING_CONFIGS,
    CONFIG_ALIASES,
    RAY_PROBE,
    areal_cpu_requirements,
)

ROOT = Path(__file__).resolve().parent.parent
SMI_DATA = Path(__file__).resolve().parent / "data" / "nvidia_smi"
CASES = {"clean": 0, "ghost": 1, "busy": 1, "none": 1}


def fake_smi_dir(tmp_path, case):
    "A directory with an `nvidia-smi` that replays the recorded outputs of `case`."
    d = tmp_path / f"bin_{case}"
    d.mkdir()
    smi = d / "nvidia-smi"
    smi.write_text(
        "#!/usr/bin/env bash\n"
        'case "$1" in\n'
        f"  --query-gpu=*) cat '{SMI_DATA / case / 'gpus.csv'}' ;;\n"
        f"  --query-compute-apps=*) cat '{SMI_DATA / case / 'apps.csv'}' ;;\n"
        "  *) echo unexpected >&2; exit 9 ;;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    return d


def replay(case):
    "Fake runner for run_preflight: the preflight script itself, reading the recorded outputs of `case` instead of nvidia-smi."

    def run(cmd, **kw):
        return subprocess.run(
            [*cmd, "--gpus-csv", str(SMI_DATA / case / "gpus.csv"), "--apps-csv", str(SMI_DATA / case / "apps.csv")],
            **kw,
        )

    return run


@pytest.mark.parametrize("case,code", CASES.items())
def test_preflight_python_on_recorded_outputs(case, code):
    rc, msg = run_preflight(run=replay(case))
    assert rc == code, msg
    if case == "ghost":
        assert "GPU 3 holds ghost memory" in msg
        assert "CUDA_VISIBLE_DEVICES=0,1,2,4,5,6,7" in msg
    if case == "busy":
        assert "GPU 0 is busy" in msg and "91234" in msg and "CUDA_VISIBLE_DEVICES=2,3,4,5,6,7" in msg
    if case == "none":
        assert "no GPU" in msg
    if case == "clean":
        assert "8 GPU(s) free" in msg


@pytest.mark.parametrize("case,code", CASES.items())
def test_preflight_script_on_recorded_outputs_agrees(tmp_path, case, code):
    d = fake_smi_dir(tmp_path, case)
    env = {**os.environ, "PATH": f"{d}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "preflight_gpus.sh")], capture_output=True, text=True, env=env)
    assert r.returncode == code, r.stdout + r.stderr
    _, msg = run_preflight(run=replay(case))
    assert (r.stdout + r.stderr).strip() == msg.strip()  # same rules, same words


def test_preflight_threshold(tmp_path):
    d = fake_smi_dir(tmp_path, "ghost")
    env = {**os.environ, "PATH": f"{d}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "preflight_gpus.sh"), "--threshold-mib", "70000"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert run_preflight(threshold_mib=70000, run=replay("ghost"))[0] == 0


def test_preflight_missing_nvidia_smi(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    bash = shutil.which("bash")
    env = {**os.environ, "PATH": f"{empty}{os.pathsep}{Path(bash).parent}"}
    env.pop("NVIDIA_SMI", None)
    if shutil.which("nvidia-smi", path=env["PATH"]):
        pytest.skip("this machine has nvidia-smi next to bash")
    r = subprocess.run([bash, str(ROOT / "scripts" / "preflight_gpus.sh")], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "nvidia-smi not found" in r.stderr
    rc, msg = run_preflight(smi=str(empty / "nvidia-smi"))
    assert rc == 2 and "not found" in msg


def test_classify_counts_pids_per_gpu():
    gpus = classify_gpus((SMI_DATA / "busy" / "gpus.csv").read_text(), (SMI_DATA / "busy" / "apps.csv").read_text())
    assert [g.status for g in gpus[:3]] == ["busy", "busy", "free"]
    assert gpus[0].pids == [91234]


# ---------------------------------------------------------------- plan and runner


class Recorder:
    def __init__(self, fail=None, ray_running=False, ray_root=None):
        self.fail, self.ray_running, self.calls, self.ray_root = fail, ray_running, [], ray_root

    def __call__(self, cmd, **kw):
        self.calls.append(list(cmd))
        if cmd == RAY_PROBE:  # the Ray client probe of launch.ray_running
            return subprocess.CompletedProcess(cmd, 0 if self.ray_running else 1, "", "")
        bad = self.fail is not None and any(self.fail in c for c in cmd)
        if cmd[:2] == ["ray", "start"] and self.ray_root is not None and not bad:  # a head's session folder appears
            (Path(self.ray_root) / "session_2099-01-01_00-00-00_000001_1").mkdir()
        return subprocess.CompletedProcess(cmd, 1 if bad else 0, "", "")


def test_plan_order_and_teardown_after_failure(tmp_path):
    plan = launch_plan("c.yaml", ["seed=2"], "ray", 8, 5.0, python="py")
    rec = Recorder(fail="sao_repro.areal.train", ray_root=tmp_path)
    stopped = []
    rc, recs = execute_plan(
        plan, run=rec, out=io.StringIO(), ray_root=tmp_path, stop_ray=lambda s: stopped.append(s) or 3
    )
    assert rc == 1
    names = [c[0:3] for c in rec.calls]
    assert stopped == ["session_2099-01-01_00-00-00_000001_1"]  # only the Ray session ray-up started
    assert ["ray", "stop"] not in [
        c[:2] for c in rec.calls
    ]  # never a bare `ray stop`: it ends every Ray on the machine
    assert [r["status"] for r in recs] == ["ok", "ok", "ok", "failed", "ok", "ok"]
    assert names.index(["sao-repro", "reward-workers", "stop"]) > names.index(["py", "-m", "sao_repro.areal.train"])


def test_preflight_failure_stops_before_training():
    rec = Recorder(fail="preflight_gpus.sh")
    rc, recs = execute_plan(launch_plan("c.yaml", [], "ray", python="py"), run=rec, out=io.StringIO())
    assert rc == 1
    assert not any("sao_repro.areal.train" in " ".join(c) for c in rec.calls)
    assert [r["status"] for r in recs][1:4] == ["skipped", "skipped", "skipped"]


def test_existing_ray_cluster_is_reused_and_not_stopped():
    rec = Recorder(ray_running=True)
    rc, recs = execute_plan(
        launch_plan("c.yaml", [], "local", python="py", preflight=False), run=rec, out=io.StringIO()
    )
    assert rc == 0
    assert ["ray", "start", "--head", "--disable-usage-stats"] not in rec.calls
    assert ["ray", "stop"] not in rec.calls
    assert not any(c[:2] == ["sao-repro", "reward-workers"] for c in rec.calls)  # reward.backend: local


# ---------------------------------------------------------------- commands for every setting


@pytest.mark.parametrize("setting", list(SETTING_CONFIGS))
def test_areal_config_prints_resolved_yaml(setting, capsys):
    import yaml

    rc = areal_config_main([str(ROOT / "configs" / SETTING_CONFIGS[setting]), "seed=3", "--dotenv", "none"])
    out = capsys.readouterr().out
    assert rc == 0
    d = yaml.safe_load(out)
    assert d["sao"]["setting"] == setting and d["seed"] == 3
    assert d["train_dataset"]["batch_size"] * d["gconfig"]["n_samples"] == 512


def test_areal_config_prints_the_paper_reading(capsys):
    "configs/phase2_hard_sao_paper.yaml resolves to setting sao with the paper-math band and frozen attention."
    import yaml

    rc = areal_config_main([str(ROOT / "configs" / "phase2_hard_sao_paper.yaml"), "seed=3", "--dotenv", "none"])
    d = yaml.safe_load(capsys.readouterr().out)
    assert rc == 0 and d["sao"]["setting"] == "sao" and d["trial_name"] == "sao_paper_s3"
    assert (d["sao"]["dis_band"], d["sao"]["critic_freeze"]) == ("paper-math", "attention")
    rs = d["actor"]["rejection_sampling"]
    assert (rs["lower"], rs["upper"]) == (0.7, 6.0)


@pytest.mark.parametrize("setting", list(SETTING_CONFIGS))
def test_launch_dry_run_prints_every_step_runs_nothing(setting):
    rec, out = Recorder(), io.StringIO()
    cfg = str(ROOT / "configs" / SETTING_CONFIGS[setting])
    rc = launch_main([cfg, "seed=5", "--dry-run", "--dotenv", "none"], run=rec, out=out)
    text = out.getvalue()
    assert rc == 0 and rec.calls == []
    for step in ("preflight", "ray-up", "reward-up", "train", "reward-down", "ray-down"):
        assert f"] {step}: " in text
    assert f"-m sao_repro.areal.train --config {cfg} seed=5" in text
    assert "--force" not in text


def test_launch_refuses_unset_paths_without_dry_run(monkeypatch):
    for v in ("SAO_WS", "MODEL_ROOT", "REWARD_ROOT"):
        monkeypatch.delenv(v, raising=False)
    rec = Recorder()
    rc = launch_main([str(ROOT / "configs" / "phase2_hard_sao.yaml"), "--dotenv", "none"], run=rec, out=io.StringIO())
    assert rc == 2 and rec.calls == []


def test_compare_runs_all_five_skips_finished_and_summarises(tmp_path, monkeypatch):
    monkeypatch.setenv("SAO_WS", str(tmp_path))
    monkeypatch.setenv("MODEL_ROOT", str(tmp_path / "models"))
    monkeypatch.setenv("REWARD_ROOT", str(tmp_path / "reward"))
    done = tmp_path / "runs" / "areal" / "grpo" / "seed1"
    done.mkdir(parents=True)
    (done / "events.log").write_text("2026-01-01T00:00:00\tstart\t{}\n2026-01-01T09:00:00\tfinish\t{}\n")
    assert is_finished(done)
    rec, out = Recorder(), io.StringIO()
    configs = [str(ROOT / "configs" / SETTING_CONFIGS[s]) for s in list_settings("comparison")]
    summary = tmp_path / "summary.json"
    rc = launch_main(
        ["--skip-finished", "--no-preflight", "--summary-json", str(summary), "--dotenv", "none", *configs],
        run=rec,
        out=out,
    )
    assert rc == 0
    trains = [c for c in rec.calls if "sao_repro.areal.train" in c]
    assert len(trains) == 4 and not any("phase2_hard_grpo.yaml" in c for t in trains for c in t)
    recs = json.loads(summary.read_text())
    assert [r["status"] for r in recs] == ["ok", "skipped", "ok", "ok", "ok"]
    assert "summary" in out.getvalue() and "skipped" in out.getvalue()


def test_a_trainer_killed_without_a_word_is_recorded_as_a_crash(tmp_path, monkeypatch):
    "A trainer ended by SIGKILL (e.g. the kernel's OOM killer) writes no event: launch records it, the run is crashed."
    from sao_repro.metrics import run_flags
    from sao_repro.runlog import log_event, read_events

    for v in ("SAO_WS", "MODEL_ROOT", "REWARD_ROOT"):
        monkeypatch.setenv(v, str(tmp_path / v))
    d = tmp_path / "runs" / "areal" / "grpo" / "seed2"

    class Killed(Recorder):
        def __call__(self, cmd, **kw):
            if "sao_repro.areal.train" in cmd:
                self.calls.append(list(cmd))
                log_event(d, "start", setting="grpo")  # the trainer made its run folder, then was killed
                return subprocess.CompletedProcess(cmd, -9, "", "")
            return super().__call__(cmd, **kw)

    out = io.StringIO()
    r = launch_setting("grpo", seed=2, out_dir=tmp_path / "runs", run=Killed(), out=out)
    assert r["status"] == "failed" and r["run_dir"] == str(d)
    train = [s for s in r["steps"] if s["step"] == "train"][0]
    assert (
        train["error"] == "error: exit -9 (SIGKILL)" and f"train: error: exit -9 (SIGKILL); see {d}" in out.getvalue()
    )
    ev = read_events(d)
    assert [e["event"] for e in ev] == ["start", "error"]
    assert ev[-1]["details"] == {"returncode": -9, "signal": "SIGKILL", "by": "launch"}
    f = run_flags(d)
    assert f["crashed"] and not f["oom"]


def test_launch_setting_for_the_experiment_notebook(tmp_path):
    rec, out = Recorder(), io.StringIO()
    r = launch_setting("running_mean", seed=2, steps=50, out_dir=tmp_path, dry_run=True, run=rec, out=out)
    assert r["status"] == "dry-run" and r["setting"] == "running_mean" and r["seed"] == 2
    assert r["run_dir"] == str(tmp_path.resolve() / "areal" / "running_mean" / "seed2")
    assert "total_train_steps=50" in out.getvalue() and rec.calls == []
    with pytest.raises(ValueError, match="unknown setting"):
        launch_setting("ppo", dry_run=True, run=rec, out=out)


@pytest.mark.slow
def test_scripts_dry_run_through_the_cli(tmp_path):
    "The shell wrappers reach `sao-repro launch` (or its python fallback) and a dry run runs nothing."
    env = {**os.environ, "PYTHON": sys.executable}
    r = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "launch_experiment.sh"),
            "configs/phase2_hard_grpo_dis_g1.yaml",
            "--dry-run",
            "--dotenv",
            "none",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "DRY-RUN [4/6] train:" in r.stdout and "setting single_dis" in r.stdout
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "launch_phase2_hard_compare.sh"), "--dry-run", "--dotenv", "none", "seed=9"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("] train: ") == 5 and "summary" in r.stdout
    for setting in list_settings("comparison"):
        assert f"(setting {setting}, seed 9)" in r.stdout


def test_env_example_lists_the_variables():
    text = (ROOT / ".env.example").read_text()
    for var in ("SAO_WS", "MODEL_ROOT", "REWARD_ROOT", "ADMIN_API_KEY"):
        assert f"\n{var}=" in "\n" + text


def test_bootstrap_check_only_changes_nothing(tmp_path):
    env = {**os.environ, "INSTALL": "0", "PYTHON": sys.executable, "BACKEND": "vllm"}
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "bootstrap_areal.sh")], capture_output=True, text=True, env=env, timeout=120
    )
    assert "+ " not in r.stdout  # no pip command ran
    assert "areal" in r.stdout
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "bootstrap_areal.sh")],
        capture_output=True,
        text=True,
        env={**env, "BACKEND": "tensorrt"},
        timeout=60,
    )
    assert r.returncode == 2


# ---------------------------------------------------------------- one preflight, one Ray probe, one place for pins


def test_preflight_reads_the_scripts_report(tmp_path):
    "Python holds no preflight rules: it runs scripts/preflight_gpus.sh and parses the GPUs from its report."
    gpus = classify_gpus("0, GPU-a, 5, 81559\n1, GPU-b, 61234, 81559\n", "GPU-a, 7, 5\n", threshold_mib=1024)
    assert [(g.index, g.status, g.pids) for g in gpus] == [(0, "busy", [7]), (1, "ghost", [])]
    d = fake_smi_dir(tmp_path, "busy")
    r = subprocess.run(
        [sys.executable, "-m", "sao_repro.cli", "preflight", "--nvidia-smi", str(d / "nvidia-smi")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 1 and "GPU 0 is busy" in r.stderr
    assert launch_plan("c.yaml", [], "local")[0].cmd[:2] == ["bash", "scripts/preflight_gpus.sh"]


def test_ray_probe_is_a_client_not_ray_status():
    seen = []

    def hang(cmd, **kw):
        seen.append((cmd, kw.get("timeout")))
        raise subprocess.TimeoutExpired(cmd, kw.get("timeout"))

    from sao_repro.areal.launch import ray_running

    assert ray_running(run=hang, timeout_s=3) is False
    assert seen == [(RAY_PROBE, 3)] and "ray.init(address='auto'" in RAY_PROBE[-1]
    from sao_repro.areal.rehearsal import run as rehearsal_run

    assert rehearsal_run.ray_running is ray_running  # the rehearsal asks the same probe (ensure_ray)


def test_areal_pins_live_in_one_file():
    deps = areal_cpu_requirements()
    text = (ROOT / "scripts" / "install_dev.sh").read_text()
    assert "scripts/areal_cpu_requirements.txt" in text
    assert [l for l in text.splitlines() if "==" in l and not l.lstrip().startswith("#")] == [
        'TORCH="${TORCH:-torch==2.13.0}"'
    ]  # no pin of AReaL's dependencies outside the file
    assert deps["areal"] == "areal==1.0.4 --no-deps" and deps["omegaconf"] == "omegaconf==2.4.0.dev2"
    from sao_repro.areal.rehearse import AREAL_CPU_DEPS

    assert AREAL_CPU_DEPS == deps
    pyproject = (ROOT / "pyproject.toml").read_text()
    for mod in ("areal", "hydra", "omegaconf"):  # the cluster extra pins the same versions
        assert f'"{deps[mod].removesuffix(" --no-deps")}"' in pyproject, mod


BLOCK = """import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == sys.argv[1]:
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
sys.meta_path.insert(0, Block())
from sao_repro.cli import main
sys.exit(main(['areal-config', 'configs/phase2_hard_sao.yaml', '--dotenv', 'none']))
"""


@pytest.mark.parametrize(
    "blocked,install",
    [("areal", "pip install --no-deps areal==1.0.4"), ("omegaconf", "pip install omegaconf==2.4.0.dev2")],
)
def test_areal_config_without_areal_says_what_to_install(blocked, install):
    "AReaL (or a package it imports) missing: exit 2 with the pip requirement and the install script, no traceback."
    r = subprocess.run([sys.executable, "-c", BLOCK, blocked], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert install in r.stderr and "bash scripts/install_dev.sh" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("alias,target", CONFIG_ALIASES.items())
def test_config_alias_loads_the_same_config(alias, target, capsys):
    "configs/phase2_hard_grpo_dis_g1.yaml (the reference's name) is configs/phase2_hard_single_dis.yaml."
    from sao_repro.areal.train import main as train_main

    outs = []
    for name in (alias, target):
        assert areal_config_main([str(ROOT / "configs" / name), "--dotenv", "none"]) == 0
        assert train_main(["--config", str(ROOT / "configs" / name), "--print-config", "--dotenv", "none"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "setting: single_dis" in outs[0]
    assert SETTING_CONFIGS["single_dis"] == target


# ---------------------------------------------------------------- bad configs: one message, exit 2
def _bad_configs(tmp_path: Path) -> dict:
    base = (ROOT / "configs" / "phase2_hard_base.yaml").read_text()
    (tmp_path / "phase2_hard_base.yaml").write_text(base)
    head = "defaults:\n  - phase2_hard_base\n  - _self_\n"
    chain = "".join(f'k{i}: "' + (f"${{k{i - 1}}}" if i else "xxxxxxxx") * 2 + '"\n' for i in range(40))
    files = {
        "typo": head + "actr:\n  kl_ctl: 0.0\n",
        "chain": head + "sao:\n  setting: sao\n" + chain,
        "type": head + "seed: not-a-number\n",
    }
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    return {k: str(tmp_path / f"{k}.yaml") for k in files}


def test_config_errors_are_one_message_with_exit_2(tmp_path, capsys):
    from sao_repro.areal.launch import areal_config_main

    bad = _bad_configs(tmp_path)
    for name, words in (("typo", "did you mean actor"), ("chain", "would expand to more than"), ("type", "seed")):
        assert areal_config_main([bad[name], "--dotenv", str(tmp_path / "none.env")]) == 2, name
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, (name, err)


def test_launch_dry_run_reports_each_config_and_ends_with_a_summary(tmp_path, capsys):
    from sao_repro.areal.launch import launch_main

    bad = _bad_configs(tmp_path)
    good = str(ROOT / "configs" / "phase2_hard_sao.yaml")
    rc = launch_main(
        ["--dry-run", "--dotenv", str(tmp_path / "none.env"), bad["typo"], good, bad["chain"]],
        run=lambda *a, **k: subprocess.CompletedProcess(a, 0),
    )
    out, err = capsys.readouterr()
    assert rc == 2
    summary = out[out.index("summary") :]
    assert all(Path(f).name in summary for f in (bad["typo"], good, bad["chain"]))
    assert summary.count("error") == 2 and "dry-run" in summary
