"""The operations guide (nbs/79_operations.ipynb) renders in the offline docs site with the symptoms its cells
compute: the monitor's flags, the preflight verdict, the reward pools' counters."""
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
    assert 'href="operations.html"' in html and "<b>Operations:</b>" in html  # in the site's navigation
    text = re.sub(r"<[^>]+>", "", html).replace("&#39;", "'").replace("&quot;", '"')
    for produced in ("reward timeout rate: 3.1% of 192 graded answers",   # the monitor's timeout rate
                     "'reward/timeouts': 1, 'reward/restarts': 1",        # a hung verification, killed and replaced
                     "reward actor 0 placed on: the other node",          # reward work off the rollout head
                     "flags: ['oom']",                                     # host OOM in the log -> oom flag
                     "actor.weight_update_mode: disk",
                     "preflight: FAIL: GPU 1 holds ghost memory",
                     "DRY-RUN [6/6] ray-down: ray stop",
                     "sao-repro reward-workers watch",
                     "areal/grpo/seed0             last step 3  flags: crashed",
                     "group-normalized with G=1: [0.0, 0.0, 0.0, 0.0]",
                     "relaunch: restored True | every folder from step ['1']",
                     "STALE? 1/3 steps with a log-prob gap > 0.0001, first at step 1"):
        assert produced in text, produced
    assert "Traceback" not in text.split("How to monitor a run")[0]  # no cell failed before the crash example


def test_guide_is_in_the_docs_sidebar_and_linked_from_the_readme():
    cfg = yaml.safe_load((ROOT / "_quarto.yml").read_text())
    sections = {s["section"]: s["contents"] for s in cfg["website"]["sidebar"]["contents"]}
    assert sections["Operations"] == ["nbs/79_operations.ipynb"]
    assert "(nbs/79_operations.ipynb)" in (ROOT / "README.md").read_text()
