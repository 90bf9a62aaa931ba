"""JupyterLab for real: `sao_repro.cli.start_lab` serves the repository, headless Chromium (Playwright) opens
experiments/explore_run.ipynb pointed at a real testbed run, runs all its cells through the page and reads the
rendered outputs; then a library notebook from nbs/ opens and renders. The server is stopped in every case.
"""

import json
import time
import urllib.error
from pathlib import Path

import pytest

from sao_repro.cli import LAB_FIRST, _children, start_lab
from sao_repro.mini.train import read_metrics, train_run
from browser import open_page
from mini_helpers import smoke_cache, smoke_cfg  # noqa: F401 (smoke_cache: an autouse fixture)

ROOT = Path(__file__).resolve().parent.parent
LIB_NB = "nbs/10_dis.ipynb"


# every code cell has run (a number in its prompt, none pending) and the kernel is idle
DONE_JS = """() => {
  const ind = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');
  const prompts = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt')]
    .map(p => p.textContent.trim());
  return ind && ind.dataset.status === 'idle' && prompts.length > 0 && prompts.every(t => /^\\[\\d+\\]:$/.test(t));
}"""

OUTPUTS_JS = """() => {
  const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
  const q = s => [...nb.querySelectorAll(s)];
  return {imgs: q('.jp-OutputArea-output img').map(i => i.src.slice(0, 22)),
          tables: q('.jp-OutputArea-output table').map(t => t.innerText),
          text: q('.jp-OutputArea-output').map(o => o.innerText).join('\\n'),
          tracebacks: q('.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]')
                        .map(o => o.innerText).filter(t => t.includes('Traceback')),
          errors: q('.jp-OutputArea-output').map(o => o.innerText).filter(t => /Error/.test(t)),
          cells: q('.jp-CodeCell').length};
}"""


def _wait_kernel_connected(lab, timeout=180):
    "Until the page's kernel is up and connected (a Run All sent before that is lost)."
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            kernels = lab.api("/api/kernels")
        except urllib.error.HTTPError as e:  # jupyter_server answers 500 while a kernel is half-started: ask again
            if e.code < 500:
                raise
            kernels = []
        if any(k["connections"] >= 1 and k["execution_state"] == "idle" for k in kernels):
            return
        time.sleep(1)
    raise AssertionError(f"no kernel connected after {timeout} s: {lab.api('/api/kernels')}")


@pytest.fixture
def lab_env(tmp_path, monkeypatch):
    "JupyterLab's user folders in tmp_path: no autosave (the repository's notebooks stay as they are), every cell in the DOM."
    settings = tmp_path / "lab-settings"
    for plugin, value in {
        "docmanager-extension/plugin": {"autosave": False},
        "notebook-extension/tracker": {"windowingMode": "none"},
        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    }.items():
        f = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    monkeypatch.setenv("JUPYTERLAB_SETTINGS_DIR", str(settings))
    for k in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
        monkeypatch.setenv(k, str(tmp_path / k.lower()))
    return tmp_path


@pytest.mark.slow
@pytest.mark.browser  # without Chromium: skipped, or failed under CI (tests/conftest.py)
def test_lab_runs_explore_notebook_on_a_real_run(lab_env, tmp_path):
    steps = 6
    run = train_run(smoke_cfg("grpo_dis", tmp_path / "runs", steps=steps), log=None)
    assert [m["step"] for m in read_metrics(run)] == list(range(1, steps + 1))
    before = {p: (ROOT / p).read_bytes() for p in (LAB_FIRST, LIB_NB)}
    lab = start_lab(ROOT, port=0, run_dir=run, log_file=tmp_path / "lab.log")
    kernels = []
    try:
        assert lab.base.startswith("http://127.0.0.1:") and len(lab.token) >= 32
        assert f"/lab/tree/{LAB_FIRST}?token=" in lab.url
        with open_page(1400, 1800) as page:
            page.set_default_timeout(120_000)
            page.goto(lab.url)
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-CodeCell")
            _wait_kernel_connected(lab)
            page.wait_for_function(
                "() => /\\| Idle/.test(document.querySelector('#jp-main-statusbar')?.innerText || '')"
            )
            page.click(".lm-MenuBar-itemLabel:text-is('Run')")
            page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
            page.wait_for_function(DONE_JS, timeout=300_000, polling=1000)
            out = page.evaluate(OUTPUTS_JS)
            kernels = _children(lab.proc.pid)
            assert out["tracebacks"] == [] and out["errors"] == [], (out["tracebacks"], out["errors"])
            assert out["imgs"] == ["data:image/png;base64,"] * 2  # the DIS and the advantages figures
            assert f"run {run}: setting grpo_dis, seed 0, {steps} steps" in out["text"]
            assert len(out["tables"]) == 2 and all(k in out["tables"][0] for k in ("acc", "adv/mean", "dis/kept_frac"))
            assert all(k in out["tables"][1] for k in ("step", "masked_share", "dis masked (metric)"))  # kept samples
            sessions = lab.api("/api/sessions")
            assert [s["path"] for s in sessions] == [LAB_FIRST] and sessions[0]["kernel"]["execution_state"] == "idle"

            # a library notebook opens and renders: its title, its prose and its code cells
            nb = json.loads((ROOT / LIB_NB).read_text())
            title = "".join(nb["cells"][0]["source"]).splitlines()[0].lstrip("# ").strip()
            page.goto(f"{lab.base}/lab/tree/{LIB_NB}?token={lab.token}")
            page.wait_for_function(
                "(t) => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) "
                ".jp-MarkdownOutput h1')].some(h => h.innerText.includes(t))",
                arg=title,
            )
            lib = page.evaluate(OUTPUTS_JS)
            n_code = sum(c["cell_type"] == "code" for c in nb["cells"])
            assert lib["cells"] == n_code and lib["tracebacks"] == []
    finally:
        lab.stop()
    assert lab.proc.poll() is not None, "JupyterLab still running"
    assert kernels, "no kernel process seen under the server"
    for pid in kernels:  # the kernels went with the server
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3], pid
    assert {p: (ROOT / p).read_bytes() for p in before} == before  # nothing saved into the repository


def test_start_lab_refuses_a_root_without_the_notebooks(tmp_path):
    with pytest.raises(FileNotFoundError, match="explore_run.ipynb"):
        start_lab(tmp_path)
