"""A new user's first commands: `make test` needs Chromium (installs it or names the command), browser tests
never pass silently skipped under CI, the README's two commands and the licence files."""
import os
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


def test_make_test_checks_chromium_and_requires_browser_tests():
    out = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "VENV": str(ROOT / ".no-such-venv")}).stdout
    lines = out.splitlines()
    chrome = next(i for i, l in enumerate(lines) if "need_chromium.sh" in l)
    tests = next(i for i, l in enumerate(lines) if "scripts/test.sh" in l)
    assert chrome < tests and "SAO_REQUIRE_BROWSER=1" in lines[tests]


def test_readme_opens_with_the_two_commands_and_the_licence_files_exist():
    readme = (ROOT / "README.md").read_text()
    top = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    assert "make study" in top and "make test" in top and "Chromium" in top
    assert "unofficial re-implementation" in readme and "not affiliated" in readme
    lic = (ROOT / "LICENSE").read_text()
    assert "Apache License" in lic and "Version 2.0, January 2004" in lic and "END OF TERMS AND CONDITIONS" in lic
    assert len(lic.splitlines()) > 190  # the full text, not a pointer to it
    notice = (ROOT / "NOTICE").read_text()
    for name in ("arXiv:2607.07508", "AReaL", "MATH"):
        assert name in notice, name
