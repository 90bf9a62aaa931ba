"""Ports given on the command line (sao_repro.checks.check_port, port_arg): `monitor`, `rehearse` and `cpu-server` exit 2
naming the range 0..65535, without a traceback. Real processes."""

import subprocess
import sys

import pytest

from run_tools import _env, cli


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_monitor_bad_port_exits_2_without_a_traceback(port, tmp_path):
    p = cli("monitor", "--logs", tmp_path, "--port", port)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "0..65535" in err and "Traceback" not in err, err


@pytest.mark.parametrize("command", [["rehearse", "--setting", "sao"], ["cpu-server", "--model", "."]])
@pytest.mark.parametrize("port", ["99999", "-1"])
def test_rehearse_and_cpu_server_bad_port_exit_2_without_a_traceback(command, port, tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "sao_repro.cli",
            *command,
            "--port",
            port,
            *(["--out", str(tmp_path)] if command[0] == "rehearse" else []),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "--port" in p.stderr and "0..65535" in p.stderr and "Traceback" not in p.stderr
    assert list(tmp_path.iterdir()) == []
