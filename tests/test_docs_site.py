"""The docs site, as `sao-repro docs --out DIR` builds it: quiet (one progress line per page and a count, no nbdev
warning block), each page's <title> its notebook's title; a warning nbdev gives is one line naming the notebook.
The whole site (slow): every notebook processed (the command exits 0 and reports no failure), one page per notebook;
headless Chromium (Playwright) opens the DIS page and finds its maths drawn as MathML, no raw `$$` left, and the
navigation as a sidebar beside the page."""

import html
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sao_repro import report as R
from sao_repro.report.docs import CODE_RE, MATH_RE, doc_notebooks, process_docs
from browser import open_page

ROOT = Path(__file__).resolve().parent.parent
MATH_NB = "nbs/10_dis.ipynb"
PROGRESS = re.compile(r"docs \[(\d+)/(\d+)\] (.+?) -> (\S+)$")


def build(root, out, *args):
    "`sao-repro docs` as users run it: (exit code, everything it printed: stdout then stderr)."
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sao_repro.cli",
            "docs",
            "--root",
            str(root),
            "--out",
            str(out),
            "--report",
            str(out.parent / "no-report.html"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=3000,
    )
    return r.returncode, r.stdout + r.stderr


def quiet_pages(output: str, out: Path) -> dict[str, str]:
    "Check a build's output is one progress line per page written then the count; returns {notebook: page} from it."
    assert "Found cells containing imports" not in output and "Warning:" not in output, output[-3000:]
    lines = [l for l in output.splitlines() if l.strip()]
    pages = sorted(p.name for p in out.glob("*.html"))
    assert lines[-1] == f"docs: wrote {len(pages)} pages to {out}", lines[-3:]
    prog = [PROGRESS.match(l) for l in lines[:-1]]
    assert all(prog), [l for l, m in zip(lines, prog) if not m][:5]
    assert [int(m.group(1)) for m in prog] == list(range(1, len(pages) + 1))  # one line per page, counted
    assert {int(m.group(2)) for m in prog} == {len(pages)}
    assert sorted(m.group(4) for m in prog) == pages
    return {m.group(3): m.group(4) for m in prog}


def notebook_title(nb_path) -> str:
    "A notebook's title: its first markdown `# Title` line, as plain text (code marks dropped)."
    nb = json.loads(Path(nb_path).read_text())
    return next(
        l[2:].replace("`", "").strip()
        for c in nb["cells"]
        if c["cell_type"] == "markdown"
        for l in "".join(c["source"]).splitlines()
        if l.startswith("# ")
    )


def page_title(page: Path) -> str:
    titles = re.findall(r"<title>(.*?)</title>", page.read_text(), flags=re.S)
    return html.unescape(titles[0]).strip() if titles else ""


def copy_root(tmp_path, names) -> Path:
    "A repository root with the package, pyproject.toml and the notebooks `names`, with no nbdev cache (`_proc`)."
    root = tmp_path / "repo"
    (root / "nbs").mkdir(parents=True)
    shutil.copy(ROOT / "pyproject.toml", root)
    shutil.copytree(ROOT / "sao_repro", root / "sao_repro", ignore=shutil.ignore_patterns("__pycache__"))
    for n in names:
        shutil.copy(ROOT / "nbs" / n, root / "nbs" / n)
    return root


def test_a_build_is_quiet_and_titles_pages_by_their_notebooks(tmp_path):
    "The index, DIS and statistics notebooks (the last had a cell nbdev warned about), processed afresh by nbdev."
    root = copy_root(tmp_path, [p.name for p in (ROOT / "nbs").glob("*.ipynb")])  # all: they make the navigation
    out = tmp_path / "_site"
    code, output = build(root, out, "--only", "10_dis.ipynb", "04_stats.ipynb")
    assert code == 0, output[-3000:]
    pages = quiet_pages(output, out)
    assert pages == {
        "index.ipynb": "index.html",
        "04_stats.ipynb": "stats.html",
        "10_dis.ipynb": "dis.html",
        "report (not built yet)": "math_hard_report.html",
    }
    assert (
        page_title(out / "dis.html")
        == notebook_title(ROOT / MATH_NB)
        == "DIS: decoupled importance sampling with a trust band"
    )
    assert page_title(out / "index.html") == notebook_title(ROOT / "nbs/index.ipynb")
    assert page_title(out / "math_hard_report.html") == "MATH-hard report"


def test_an_nbdev_warning_is_one_line_naming_the_notebook(tmp_path, capsys):
    "A cell beside exports mixing imports and other code makes nbdev warn with a block; the build says it in one line."
    root = copy_root(tmp_path, [])
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Mixed\n", "> a cell mixes imports and code"]},
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": ["#| default_exp mixed"],
        },
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": ["#| export\n", "def f():\n", '    "One."\n', "    return 1"],
        },
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": ["import os\n", "sep = os.sep\n", "assert f() == 1"],
        },
    ]
    (root / "nbs" / "11_mixed.ipynb").write_text(
        json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    lines = []
    done = process_docs(root, ["11_mixed.ipynb"], log=lines.append)
    assert list(done) == ["11_mixed.ipynb"]
    assert lines == ["docs: nbdev: 11_mixed.ipynb cell 3: Found cells containing imports and other code. See FAQ."]
    printed = capsys.readouterr()
    assert "Found cells" not in printed.out + printed.err and "sep = os.sep" not in printed.out + printed.err


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    "The full site, built once by the command CI and users run."
    out = tmp_path_factory.mktemp("docs") / "_site"
    t0 = time.monotonic()
    code, output = build(ROOT, out)
    assert code == 0, output[-3000:]
    print(f"docs site built in {time.monotonic() - t0:.0f} s")
    return out, output


def _source_maths(nb_path) -> int:
    "How many $...$ / $$...$$ formulas the notebook's markdown cells hold (outside code)."
    nb = json.loads(Path(nb_path).read_text())
    md = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    return sum(len(MATH_RE.findall(part)) for s in md for i, part in enumerate(CODE_RE.split(s)) if i % 2 == 0)


@pytest.mark.slow
def test_every_notebook_has_a_page(site):
    out, output = site
    pages = sorted(p.name for p in out.glob("*.html"))
    n = len(doc_notebooks(ROOT)) + 2  # + index.html and the report's page
    assert f"docs: wrote {n} pages to {out}" in output
    assert len(pages) == n and "index.html" in pages and "math_hard_report.html" in pages
    made = quiet_pages(output, out)  # quiet: one progress line per page, no nbdev warning block
    for nb in [Path("nbs/index.ipynb"), *doc_notebooks(ROOT)]:
        assert page_title(out / made[nb.name]) == notebook_title(ROOT / nb), nb
    for p in out.glob("*.html"):
        html = p.read_text()
        assert R.offline_violations(html) == [], p.name
        assert '<nav class="sao-nav">' in html and "Error in notebook" not in html, p.name
        assert not re.search(r"^#\|", re.sub(r"<[^>]+>", "", html), flags=re.M), p.name  # nbdev's directives processed


@pytest.mark.slow
@pytest.mark.browser  # without Chromium: skipped, or failed under CI (tests/conftest.py)
def test_maths_render_and_the_sidebar_in_the_browser(site):
    out, _ = site
    page_file = out / "dis.html"
    want = _source_maths(ROOT / MATH_NB)
    assert want >= 5, want  # the DIS notebook states its maths
    assert "$$" not in page_file.read_text()
    with open_page(1400, 1000) as page:
        page.goto(page_file.as_uri())
        got = page.evaluate("""() => {
          const maths = [...document.querySelectorAll('math')];
          const nav = document.querySelector('nav.sao-nav'), cur = nav.querySelector('a[aria-current]');
          const first = document.querySelector('.jp-Cell');
          return {n: maths.length, blocks: document.querySelectorAll('math[display="block"]').length,
                  drawn: maths.filter(m => { const r = m.getBoundingClientRect(); return r.width > 0 && r.height > 0; }).length,
                  text: document.body.innerText,
                  nav: {position: getComputedStyle(nav).position, right: nav.getBoundingClientRect().right,
                        height: nav.getBoundingClientRect().height, current: cur && cur.textContent},
                  content_left: first.getBoundingClientRect().left};
        }""")
    assert got["n"] >= want and got["blocks"] >= 1, got["n"]
    assert got["drawn"] == got["n"]  # each formula takes room on the page: MathML drawn, not hidden source
    assert "$$" not in got["text"] and "\\frac" not in got["text"] and "\\pi" not in got["text"]
    assert "Traceback" not in got["text"] and "Error in notebook" not in got["text"]
    nav = got["nav"]
    assert nav["position"] == "fixed" and nav["height"] >= 900  # a full-height column ...
    assert nav["right"] <= got["content_left"]  # ... beside the page, not over it
    assert nav["current"] and "DIS" in nav["current"]


def test_docs_never_write_through_a_link_and_out_naming_a_file_is_one_line(tmp_path):
    root = copy_root(tmp_path, [p.name for p in (ROOT / "nbs").glob("*.ipynb")])
    out = tmp_path / "_site"
    out.mkdir()
    victim = tmp_path / "victim.html"
    victim.write_text("not yours")
    (out / "stats.html").symlink_to(victim)
    code, output = build(root, out, "--only", "04_stats.ipynb")
    assert code == 0, output[-3000:]
    assert victim.read_text() == "not yours" and not (out / "stats.html").is_symlink()
    assert "removed the link" in output
    code, output = build(root, victim, "--only", "04_stats.ipynb")
    assert code == 2 and "that is a file" in output and "Traceback" not in output and victim.read_text() == "not yours"
