"""Notebook runs are quiet: the kernels papermill starts for `compare` and `report` talk over IPC sockets, so
ipykernel's 'Kernel is running over TCP without encryption' warning never reaches the user's terminal."""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from sao_repro.report import kernel_config

WARNING = "without encryption"
CLI = "import sys; from sao_repro.cli import main; sys.exit(main(sys.argv[1:]))"


def test_run_notebook_uses_ipc_and_its_stderr_has_no_transport_warning(tmp_path):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}})
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("from ipykernel.kernelapp import IPKernelApp\n"
                                          "print(IPKernelApp.instance().transport, x)")]
    nbformat.write(nb, str(tmp_path / "t.ipynb"))
    code = ("import sys; from sao_repro.report import run_notebook; "
            "run_notebook(sys.argv[1], sys.argv[2], {'x': 7})")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t.ipynb"), str(tmp_path / "o.ipynb")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert WARNING not in r.stderr and WARNING not in r.stdout
    out = json.loads((tmp_path / "o.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in out["cells"] for o in c.get("outputs", []))
    assert printed.strip() == f"{kernel_config()['KernelManager']['transport']} 7"
    assert kernel_config()["KernelManager"]["transport"] == "ipc"  # on this Linux machine


@pytest.mark.slow
def test_compare_prints_no_transport_warning(tmp_path):
    "A tiny `sao-repro compare` (papermill per run): its terminal output carries no kernel transport warning."
    r = subprocess.run([sys.executable, "-c", CLI, "compare", "--settings", "running_mean", "--seeds", "1", "--smoke",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (Path(tmp_path) / "mini" / "running_mean" / "seed0" / "run_setting.ipynb").exists()
    assert WARNING not in r.stderr and WARNING not in r.stdout
