"""sao_repro.nbrun: notebook runs are quiet: the kernels papermill starts for `compare` and `report` talk over IPC sockets, so
ipykernel's 'Kernel is running over TCP without encryption' warning never reaches the user's terminal."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from sao_repro.report import kernel_transport, run_notebook

WARNING = "without encryption"
CLI = "import sys; from sao_repro.cli import main; sys.exit(main(sys.argv[1:]))"


def tiny_notebook(path, *sources):
    "A python3 notebook whose first cell is the parameters cell."
    nb = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}}
    )
    nb.cells = [nbformat.v4.new_code_cell(sources[0], metadata={"tags": ["parameters"]})]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources[1:]]
    nbformat.write(nb, str(path))
    return path


def test_run_notebook_uses_ipc_and_its_stderr_has_no_transport_warning(tmp_path):
    tiny_notebook(
        tmp_path / "t.ipynb",
        "x = 1",
        "from ipykernel.kernelapp import IPKernelApp\n"
        "app = IPKernelApp.instance()\n"
        "print(app.transport, x, app.log_level)",
    )
    code = "import sys; from sao_repro.report import run_notebook; run_notebook(sys.argv[1], sys.argv[2], {'x': 7})"
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "t.ipynb"), str(tmp_path / "o.ipynb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert WARNING not in r.stderr and WARNING not in r.stdout
    assert (
        "IPKernelApp" not in r.stderr
    )  # nor any other kernel warning (e.g. a kernel left running: "Parent appears to have exited")
    out = json.loads((tmp_path / "o.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in out["cells"] for o in c.get("outputs", []))
    # a POSIX machine: the kernel listened on IPC sockets, not TCP; its own log keeps only critical errors (the
    # shutdown's SIGINT racing a message handler logs "KeyboardInterrupt caught in kernel." at ERROR)
    assert printed.strip() == "ipc 7 50"


def test_kernels_started_side_by_side_do_not_share_sockets(tmp_path):
    "compare --jobs 2 starts two kernels at once from one process: each must talk to its own."
    from concurrent.futures import ThreadPoolExecutor

    tiny_notebook(tmp_path / "t.ipynb", "x = 0", "print(x * 10)")
    with ThreadPoolExecutor(2) as ex:
        outs = list(ex.map(lambda k: run_notebook(tmp_path / "t.ipynb", tmp_path / f"o{k}.ipynb", {"x": k}), (1, 2)))
    for k, o in zip((1, 2), outs):
        cells = json.loads(o.read_text())["cells"]
        assert "".join(cells[-1]["outputs"][0]["text"]).strip() == str(10 * k)
    assert kernel_transport(tmp_path)["transport"] == "ipc"


@pytest.mark.slow
def test_compare_prints_no_transport_warning(tmp_path):
    "A tiny `sao-repro compare` (papermill per run): its terminal output carries no kernel transport warning."
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            CLI,
            "compare",
            "--settings",
            "running_mean",
            "--seeds",
            "1",
            "--smoke",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert (Path(tmp_path) / "mini" / "running_mean" / "seed0" / "run_setting.ipynb").exists()
    assert WARNING not in r.stderr and WARNING not in r.stdout
