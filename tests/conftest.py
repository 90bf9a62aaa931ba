"""Shared pytest setup.

AReaL 1.0.4 tests import the real packages AReaL imports on a CPU (scripts/install_dev.sh installs them from
scripts/areal_cpu_requirements.txt); nothing is faked.
"""

import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _TESTS)


# Browser tests (marker `browser`) need headless Chromium. Without it they are skipped on a laptop, but fail
# under CI (`CI` set) or `make test` (`SAO_REQUIRE_BROWSER=1`), so a run never passes with them left out.
CHROMIUM_INSTALL = "sudo apt-get install -y chromium"


def browser_gate(env, chromium):
    "None when a browser test may run; else ('skip' | 'fail', message)."
    if chromium:
        return None
    msg = f"needs headless Chromium, not found (install: {CHROMIUM_INSTALL}, or set CHROMIUM=/path/to/chrome)"
    required = any(
        env.get(k, "").strip().lower() not in ("", "0", "false", "no") for k in ("CI", "SAO_REQUIRE_BROWSER")
    )
    return (
        ("fail", msg + "; CI / SAO_REQUIRE_BROWSER does not allow skipping browser tests")
        if required
        else ("skip", msg)
    )


def pytest_runtest_setup(item):
    if item.get_closest_marker("browser") is None:
        return
    from sao_repro.report import find_chromium

    gate = browser_gate(os.environ, find_chromium())
    if gate is not None:
        import pytest

        (pytest.fail if gate[0] == "fail" else pytest.skip)(gate[1])


def pypi_only_env():
    "This environment as pip sees it on a machine with PyPI alone: no local wheel folder, no pip configuration."
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
