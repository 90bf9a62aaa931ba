"""Cluster launch glue: GPU preflight on recorded nvidia-smi outputs (Python and bash agree), the launch plan
with a mocked runner, `areal-config` and `launch --dry-run` for every setting, the scripts."""
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sao_repro.launch import (GPU_QUERY, APPS_QUERY, classify_gpus, preflight_report, run_preflight, launch_plan,
                              execute_plan, launch_main, areal_config_main, launch_setting, is_finished, SETTING_CONFIGS)

ROOT = Path(__file__).resolve().parent.parent
SMI_DATA = Path(__file__).resolve().parent / "data" / "nvidia_smi"
CASES = {"clean": 0, "ghost": 1, "busy": 1, "none": 1}


def fake_smi_dir(tmp_path, case):
    "A directory with an `nvidia-smi` that replays the recorded outputs of `case`."
    d = tmp_path / f"bin_{case}"
    d.mkdir()
    smi = d / "nvidia-smi"
    smi.write_text("#!/usr/bin/env bash\n"
                   "case \"$1\" in\n"
                   f"  --query-gpu=*) cat '{SMI_DATA / case / 'gpus.csv'}' ;;\n"
                   f"  --query-compute-apps=*) cat '{SMI_DATA / case / 'apps.csv'}' ;;\n"
                   "  *) echo unexpected >&2; exit 9 ;;\n"
                   "esac\n")
    smi.chmod(0o755)
    return d


def replay(case):
    "Fake runner for run_preflight."
    def run(cmd, **kw):
        f = "gpus.csv" if cmd[1] == GPU_QUERY[0] else "apps.csv"
        return subprocess.CompletedProcess(cmd, 0, (SMI_DATA / case / f).read_text(), "")
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
    r = subprocess.run(["bash", str(ROOT / "scripts" / "preflight_gpus.sh"), "--threshold-mib", "70000"],
                       capture_output=True, text=True, env=env)
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
    def __init__(self, fail=None, ray_running=False):
        self.fail, self.ray_running, self.calls = fail, ray_running, []

    def __call__(self, cmd, **kw):
        self.calls.append(list(cmd))
        if cmd[:2] == ["ray", "status"]:
            return subprocess.CompletedProcess(cmd, 0 if self.ray_running else 1, "", "")
        bad = self.fail is not None and any(self.fail in c for c in cmd)
        return subprocess.CompletedProcess(cmd, 1 if bad else 0, "", "")


def test_plan_order_and_teardown_after_failure():
    plan = launch_plan("c.yaml", ["seed=2"], "ray", 8, 5.0, python="py")
    rec = Recorder(fail="sao_repro.areal.train")
    rc, recs = execute_plan(plan, run=rec, out=io.StringIO())
    assert rc == 1
    names = [c[0:3] for c in rec.calls]
    assert ["ray", "stop"] in [c[:2] for c in rec.calls]
    assert all("--force" not in c for c in rec.calls)
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
    rc, recs = execute_plan(launch_plan("c.yaml", [], "local", python="py", preflight=False), run=rec, out=io.StringIO())
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
    configs = [str(ROOT / "configs" / SETTING_CONFIGS[s]) for s in SETTING_CONFIGS]
    summary = tmp_path / "summary.json"
    rc = launch_main(["--skip-finished", "--no-preflight", "--summary-json", str(summary), "--dotenv", "none", *configs],
                     run=rec, out=out)
    assert rc == 0
    trains = [c for c in rec.calls if "sao_repro.areal.train" in c]
    assert len(trains) == 4 and not any("phase2_hard_grpo.yaml" in c for t in trains for c in t)
    recs = json.loads(summary.read_text())
    assert [r["status"] for r in recs] == ["ok", "skipped", "ok", "ok", "ok"]
    assert "summary" in out.getvalue() and "skipped" in out.getvalue()


def test_launch_setting_for_the_experiment_notebook(tmp_path):
    rec, out = Recorder(), io.StringIO()
    r = launch_setting("running_mean", seed=2, steps=50, out_dir=tmp_path, dry_run=True, run=rec, out=out)
    assert r["status"] == "dry-run" and r["setting"] == "running_mean" and r["seed"] == 2
    assert r["run_dir"] == str(tmp_path.resolve() / "areal" / "running_mean" / "seed2")
    assert "total_train_steps=50" in out.getvalue() and rec.calls == []
    with pytest.raises(ValueError, match="unknown setting"):
        launch_setting("ppo", dry_run=True, run=rec, out=out)


def test_scripts_dry_run_through_the_cli(tmp_path):
    "The shell wrappers reach `sao-repro launch` (or its python fallback) and a dry run runs nothing."
    env = {**os.environ, "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "launch_experiment.sh"), "configs/phase2_hard_grpo_dis_g1.yaml",
                        "--dry-run", "--dotenv", "none"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "DRY-RUN [4/6] train:" in r.stdout and "setting single_dis" in r.stdout
    r = subprocess.run(["bash", str(ROOT / "scripts" / "launch_phase2_hard_compare.sh"), "--dry-run", "--dotenv", "none",
                        "seed=9"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("] train: ") == 5 and "summary" in r.stdout
    for setting in SETTING_CONFIGS:
        assert f"(setting {setting}, seed 9)" in r.stdout


def test_env_example_lists_the_variables():
    text = (ROOT / ".env.example").read_text()
    for var in ("SAO_WS", "MODEL_ROOT", "REWARD_ROOT", "ADMIN_API_KEY"):
        assert f"\n{var}=" in "\n" + text


def test_bootstrap_check_only_changes_nothing(tmp_path):
    env = {**os.environ, "INSTALL": "0", "PYTHON": sys.executable, "BACKEND": "vllm"}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap_areal.sh")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert "+ " not in r.stdout  # no pip command ran
    assert "areal" in r.stdout
    r = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap_areal.sh")], capture_output=True, text=True,
                       env={**env, "BACKEND": "tensorrt"}, timeout=60)
    assert r.returncode == 2
