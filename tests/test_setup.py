"""A new user's first commands: `make test` needs Chromium (installs it or names the command), browser tests
never pass silently skipped under CI, what `make test` and `make study` run, and the licence files."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import CHROMIUM_INSTALL, browser_gate, pypi_only_env

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
    r = subprocess.run(
        ["/bin/bash", str(ROOT / "scripts" / "need_chromium.sh")], env=env, capture_output=True, text=True
    )
    assert r.returncode == 1
    assert CHROMIUM_INSTALL in r.stderr and "CHROMIUM=" in r.stderr


def test_need_chromium_finds_the_browser_named_by_CHROMIUM(tmp_path):
    fake = tmp_path / "my-chrome"
    fake.write_text("#!/bin/sh\necho Chromium 1.2.3\n")
    fake.chmod(0o755)
    r = subprocess.run(
        ["/bin/bash", str(ROOT / "scripts" / "need_chromium.sh")],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "CHROMIUM": str(fake)},
    )
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
    stub(
        "scripts/install_dev.sh",
        f'echo "install TORCH=$TORCH" >> {log}; '
        f"printf '#!/bin/bash\\necho \"sao-repro $*\" >> {log}\\n' > .venv/bin/sao-repro; chmod +x .venv/bin/sao-repro",
    )
    stub("scripts/need_chromium.sh", f"echo chromium >> {log}")
    stub("scripts/install_vllm_cpu.sh", f"echo vllm-env >> {log}")
    stub(
        "scripts/test.sh",
        f'echo "test SAO_REQUIRE_BROWSER=$SAO_REQUIRE_BROWSER sao-repro=$(command -v sao-repro)" >> {log}',
    )
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


@pytest.mark.slow
def test_the_whole_install_set_resolves_where_pip_sees_only_pypi(tmp_path):
    """What `make install` installs (torch, the package with its dev extra, AReaL's CPU pins) resolves against PyPI
    alone, where torch 2.13.0 is a CUDA build with its own triton pin: `pip install --dry-run`, nothing installed."""
    import json
    import sys

    deps = ROOT / "scripts" / "areal_cpu_requirements.txt"  # as it stands: what install_dev.sh and a user give pip
    reqs = deps.read_text().splitlines()
    torch_pin = re.search(r"^TORCH \?= (\S+)", (ROOT / "Makefile").read_text(), re.M)[1]
    report = tmp_path / "report.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            torch_pin,
            "-e",
            f"{ROOT}[dev]",
            "-r",
            str(deps),
        ],
        env=pypi_only_env(),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert got["torch"] == torch_pin.split("==")[1]  # PyPI's build of the pinned torch, not another release
    assert (
        "areal" not in got
    )  # installed last with --no-deps, from areal_nodeps.txt (its metadata asks for a CUDA stack)
    for line in reqs:  # every pin is what gets installed
        req = line.partition("#")[0].strip()
        if "==" in req:
            name = re.split(r"[\[=]", req)[0].lower()
            assert got[name] == req.split("==")[1], (req, got[name])


def test_a_failed_install_is_retried_by_running_it_again(tmp_path):
    """A pip that fails once (a network error mid-install): the script stops with pip's output and how to retry;
    the same command again finishes, and it says which torch build it got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "pip").write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {calls}\n'
        f'if [[ "$*" == *"-r "* ]] && [ ! -e {tmp_path}/failed-once ]; then\n'
        f'  touch {tmp_path}/failed-once; echo "Collecting transformers==5.3.0"; echo "ERROR: connection reset" >&2; exit 1\n'
        "fi\n"
        'echo "Collecting x"; echo "  Downloading x-1.0-py3-none-any.whl (1.2 MB)"; echo "Installing collected packages: x, y"\n'
    )
    (bin_dir / "python").write_text(
        '#!/bin/bash\nif [ "$1" = - ]; then echo "    torch 2.13.0+cpu: the CPU build (0.8 GB on disk)"; fi\n'
    )
    for f in ("pip", "python"):
        (bin_dir / f).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    first = subprocess.run(["bash", str(ROOT / "scripts" / "install_dev.sh")], env=env, capture_output=True, text=True)
    assert first.returncode == 1
    assert "ERROR: connection reset" in first.stderr and "run the same command again to retry" in first.stderr
    assert "install [4/5]" in first.stdout and "install [5/5]" not in first.stdout
    again = subprocess.run(["bash", str(ROOT / "scripts" / "install_dev.sh")], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "install done" in again.stdout and "the CPU build" in again.stdout
    assert "downloading x-1.0-py3-none-any.whl (1.2 MB)" in again.stdout and "installing 2 package(s)" in again.stdout


APACHE_2_SHA256 = (
    "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"  # apache.org/licenses/LICENSE-2.0.txt
)


def test_the_licence_files_hold_apache_2_and_the_credits():
    import hashlib
    import tomllib

    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    notice = (ROOT / "NOTICE").read_text()
    for name in ("arXiv:2607.07508", "AReaL", "MATH"):
        assert name in notice, name
