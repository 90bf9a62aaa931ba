"""The operations guide (nbs/79_operations.ipynb) renders in the offline docs site with the symptoms its cells
compute: the monitor's flags, the preflight verdict, the reward pools' counters."""

import io
import json
import re
from pathlib import Path

import pytest
import yaml

from sao_repro import report as R

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_operations_guide_renders_with_computed_symptoms(tmp_path):
    pages = R.build_docs(ROOT, tmp_path / "site", only=["79_operations.ipynb"], report_html=tmp_path / "none.html")
    guide = tmp_path / "site" / "operations.html"
    assert guide in pages
    html = guide.read_text()
    assert R.offline_violations(html) == []
    assert 'href="operations.html"' in html and "<summary>Guides</summary>" in html  # in the site's navigation
    text = (
        re.sub(r"<[^>]+>", "", html)
        .replace("&#39;", "'")
        .replace("&quot;", '"')
        .replace("&gt;", ">")
        .replace("&lt;", "<")
        .replace("&amp;", "&")
    )
    nb = json.loads((ROOT / "nbs" / "79_operations.ipynb").read_text())
    shown = [
        c
        for c in nb["cells"]
        if c["cell_type"] == "code" and "#| exec_doc" in "".join(c["source"]) and "print(" in "".join(c["source"])
    ]
    assert len(shown) >= 10 and html.count("jp-OutputArea-output") >= len(shown)  # every symptom cell shows its output
    # the symptoms, computed here with the package's own code, are what the page shows
    from sao_repro.areal.launch import execute_plan, launch_plan, preflight_report

    rc, msg = preflight_report("0, GPU-a, 1, 81559\n1, GPU-b, 61234, 81559\n", "")  # GPU 1: memory, no process
    ghost = next(l for l in msg.splitlines() if "FAIL" in l)
    assert rc == 1 and "GPU 1" in ghost and ghost in text
    out = io.StringIO()
    execute_plan(
        launch_plan("configs/phase2_hard_sao.yaml", [], "ray", 32, 5.0, python="python"), dry_run=True, out=out
    )
    for line in out.getvalue().splitlines():
        assert line.strip() in text, line
    mode = yaml.safe_load((ROOT / "configs" / "phase2_hard_base.yaml").read_text())["actor"]["weight_update_mode"]
    assert f"actor.weight_update_mode: {mode}" in text
    assert f"{6 / 192:.1%}" in text  # the monitor's reward timeout rate of the example log
    assert (
        "Traceback (most recent call last)" not in text.split("How to monitor a run")[0]
    )  # no cell failed before the crash example


def test_guide_is_in_the_docs_sidebar_and_linked_from_the_readme():
    cfg = yaml.safe_load((ROOT / "_quarto.yml").read_text())
    sections = {s["section"]: s["contents"] for s in cfg["website"]["sidebar"]["contents"]}
    assert "nbs/79_operations.ipynb" in sections["Guides"]
    assert "(nbs/79_operations.ipynb)" in (ROOT / "README.md").read_text()  # the link works from the repository root
