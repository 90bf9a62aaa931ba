"""The MATH-hard report: rendered from a small real testbed comparison, offline HTML, numbers, caching, browser checks.

The runs are made once per session by the CPU testbed (sao_repro.mini): 2 settings x 2 seeds x 60 steps
of the smoke-size model on 1-digit arithmetic (so accuracy is not stuck at 0), in this process.
"""

import json
import math
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from sao_repro import report as R
from sao_repro.report import build
from sao_repro.metrics import collect_metrics, summarize_runs
from run_tools import _write_metrics

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ("sao", "grpo")
SEEDS = (0, 1)
STEPS = 60
T975 = {1: 12.706, 2: 4.303, 3: 3.182}  # printed t table, two-sided 95%


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    "A real testbed comparison (sao, grpo) x seeds 0, 1, made with the testbed's own run function."
    import torch
    from sao_repro.mini.cli import run_setting

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("runs")
    ov = {
        "preset": "smoke",
        "difficulty": 1,
        "trajectories_per_step": 16,
        "eval_every": 20,
        "n_eval": 32,
        "ckpt_every": STEPS,
    }
    for s in SETTINGS:
        for k in SEEDS:
            run_setting(s, k, STEPS, out_dir=str(out), overrides=ov, log=None)
    return out


@pytest.fixture(scope="session")
def rendered(runs, tmp_path_factory):
    "The report rendered once through the CLI function with the default formats (html, plus pdf when Chromium is present)."
    out = tmp_path_factory.mktemp("report")
    with (
        pytest.MonkeyPatch.context() as mp
    ):  # from the folder holding the runs, with relative paths as a user types them
        mp.chdir(runs.parent)
        assert R.report_main(["--runs", runs.name, "--out", out.name, "--engine", "nbconvert"]) == 0
    return out


class Tables(HTMLParser):
    "Collect every <table id=...> as a list of rows of cell texts."

    def __init__(self):
        super().__init__()
        self.tables, self._id, self._row, self._cell = {}, None, None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("id"):
            self._id = a["id"]
            self.tables[self._id] = []
        elif tag == "tr" and self._id:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(self._cell.strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._id].append(self._row)
            self._row = None
        elif tag == "table":
            self._id = None


def table(html, table_id):
    p = Tables()
    p.feed(html)
    rows = p.tables[table_id]
    return [dict(zip(rows[0], r)) for r in rows[1:]]


def test_html_is_self_contained_with_figures_and_tables(rendered):
    html = (rendered / "math_hard_report.html").read_text()
    assert len(re.findall(r'<img[^>]+src="data:image/png;base64,', html)) >= 3  # accuracy, DIS, critic
    assert R.offline_violations(html) == []
    assert not re.search(r"<(script|link)[^>]+(src|href)=\"https?://", html)
    for tid in ("design-table", "numbers-table", "reference-table", "distance-table", "runs-table"):
        assert f'id="{tid}"' in html, tid
    assert "Traceback" not in html and "Error" not in html.split("</style>")[-1]


def test_numbers_equal_those_computed_from_the_metrics(rendered, runs):
    "Window means (first / last 50 steps of acc) and t-based 95% CIs, recomputed here from metrics.jsonl."
    html = (rendered / "math_hard_report.html").read_text()
    rows = {r["setting"]: r for r in table(html, "numbers-table")}
    assert sorted(rows) == sorted(SETTINGS)
    for s in SETTINGS:
        starts, ends = [], []
        for k in SEEDS:
            ms = [json.loads(l) for l in (runs / "mini" / s / f"seed{k}" / "metrics.jsonl").read_text().splitlines()]
            acc = {m["step"]: m["acc"] for m in ms}
            first, last = min(acc), max(acc)
            starts.append(sum(v for st, v in acc.items() if st < first + 50) / sum(1 for st in acc if st < first + 50))
            ends.append(sum(v for st, v in acc.items() if st > last - 50) / sum(1 for st in acc if st > last - 50))

        def mci(xs):
            m = sum(xs) / len(xs)
            sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
            return m, T975[len(xs) - 1] * sd / math.sqrt(len(xs))

        (sm, sh), (em, eh) = mci(starts), mci(ends)
        r = rows[s]
        assert r["accuracy start -> end"] == f"{sm:.3f} -> {em:.3f}"
        assert r["start (first 50), 95% CI"] == f"{sm:.3f} ± {sh:.3f}"
        assert r["end (last 50), 95% CI"] == f"{em:.3f} ± {eh:.3f}"
        assert r["seeds"] == str(len(SEEDS)) and r["steps"] == str(STEPS) and r["traj/step"] == "16"
        assert r["prompts x G"] == {"sao": "16 x 1", "grpo": "2 x 8"}[s]
    assert 0 < max(float(r["accuracy start -> end"].split()[0]) for r in rows.values())  # not all-zero runs
    # the JSON written beside the HTML agrees with the metrics module's per-run windows
    nums = {n["setting"]: n for n in json.loads((rendered / "numbers.json").read_text())}
    summ = summarize_runs(collect_metrics(runs), 50, 50)
    for s in SETTINGS:
        assert nums[s]["acc_end"] == pytest.approx(summ[summ.setting == s].end_acc.mean())


def test_reference_numbers_are_separate_and_labeled(rendered):
    html = (rendered / "math_hard_report.html").read_text()
    ref = {r["setting"]: r for r in table(html, "reference-table")}
    assert ref["grpo"]["accuracy start -> end (reported)"] == "~39% -> ~15%"
    assert ref["grpo"]["steps"] == "268" and "collapse" in ref["grpo"]["note"]
    assert ref["grpo_dis"]["accuracy start -> end (reported)"] == "~40% -> ~57%"
    numbers = " ".join(" ".join(r.values()) for r in table(html, "numbers-table"))
    assert "~" not in numbers and "%" not in numbers
    assert "not our runs" in html and "Qwen3-4B" in html


def expand_braces(pattern):
    "The paths a brace pattern names: `a/{b,c}/seed{0,1}` -> a/b/seed0, a/b/seed1, a/c/seed0, a/c/seed1."
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return {pattern}
    return {p for alt in m.group(1).split(",") for p in expand_braces(pattern[: m.start()] + alt + pattern[m.end() :])}


def test_every_figure_and_table_names_its_runs_and_command(rendered, runs):
    html = (rendered / "math_hard_report.html").read_text()
    lines = re.findall(r"run folders:(.*?)Made", html, flags=re.S)
    assert (
        len(lines) == 12
    )  # accuracy, headline, numbers, per run, DIS, mismatch, kept samples, critic, health, distance, manifests, run files (design / reference name their sources)
    assert all(folders.count("<code>") == 1 for folders in lines)  # one brace pattern for the folders of a study
    named = [
        {
            re.fullmatch(r"runs\d*/mini/(\w+)/seed(\d)", p).groups()
            for c in re.findall(r"<code>([^<]*)</code>", line)
            for p in expand_braces(c)
        }
        for line in lines
    ]
    every = {(s, str(k)) for s in SETTINGS for k in SEEDS}
    assert all(named[i] == every for i in (0, 1, 2, 3, 5, 8, 9, 10, 11))
    assert named[4] == named[7] == {("sao", "0"), ("sao", "1")}  # DIS and critic figures draw only sao here
    assert named[6] == {(s, "0") for s in SETTINGS}  # kept samples: one run per backend and setting
    assert html.count("sao-repro report --runs") >= 9
    assert 'id="health-table"' in html
    assert "sao-repro run --setting sao --seed 1 --steps 60" in html


def test_rerender_with_unchanged_runs_is_reused(rendered, runs, monkeypatch, capsys, tmp_path):
    "Same runs: nothing is executed again, whatever --format / --screenshot ask for; outputs are untouched."
    monkeypatch.chdir(runs.parent)  # the paths as the first render named them
    outs = [rendered / f"math_hard_report.{x}" for x in ("ipynb", "html")] + [rendered / "numbers.json"]
    before = [p.stat().st_mtime_ns for p in outs]

    def boom(*a, **k):
        raise AssertionError("executed again")

    monkeypatch.setattr(build, "execute_report", boom)  # looked up by render_report in sao_repro.report.build
    monkeypatch.setattr(build, "notebook_to_html", boom)
    for fmt in ("html", "html,pdf"):
        assert (
            R.report_main(["--runs", runs.name, "--out", rendered.name, "--format", fmt, "--engine", "nbconvert"]) == 0
        )
        assert "inputs unchanged, reused" in capsys.readouterr().out
    assert [p.stat().st_mtime_ns for p in outs] == before
    if R.find_chromium():
        pdf = rendered / "math_hard_report.pdf"
        t = pdf.stat().st_mtime_ns
        assert R.report_main(["--runs", runs.name, "--out", rendered.name, "--format", "pdf"]) == 0
        assert pdf.stat().st_mtime_ns == t
    with pytest.raises(AssertionError, match="executed again"):  # a changed window is a different report
        R.report_main(["--runs", runs.name, "--out", rendered.name, "--start-steps", "10"])


def test_missing_or_empty_runs_folder_is_a_clear_error(tmp_path, capsys):
    assert R.report_main(["--runs", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 1
    assert "sao-repro compare" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert R.report_main(["--runs", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 1
    assert "no run folders" in capsys.readouterr().err
    assert not (tmp_path / "o" / "math_hard_report.html").exists()


@pytest.mark.browser
def test_pdf_and_screenshot(rendered, tmp_path):
    pdf = rendered / "math_hard_report.pdf"
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 20_000
    png = R.screenshot(rendered / "math_hard_report.html", tmp_path / "shot.png")
    stats = R.image_stats(png)
    assert stats["size"] == (1280, 2000)
    assert not R.is_blank(png), stats
    assert stats["n_colors"] > 100  # text, tables and a figure, not a plain page


def test_quarto_yml_parses_and_names_existing_files():
    cfg = yaml.safe_load((ROOT / "_quarto.yml").read_text())
    assert cfg["project"]["type"] == "website"
    assert cfg["project"]["output-dir"] == "_docs"  # nbdev's doc_path
    files = R.quarto_files(cfg)
    assert "report/math_hard_report.ipynb" in files and any(f.startswith("nbs/") for f in files)
    for f in files:
        assert (ROOT / f).exists(), f
    assert R.check_quarto_yml(ROOT) == [], "run `sao-repro docs --write-quarto-yml`"


def test_report_notebook_has_a_literal_parameters_cell():
    nb = json.loads((ROOT / R.REPORT_NB).read_text())
    cells = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1
    src = "".join(cells[0]["source"])
    names = {l.split("=")[0].strip() for l in src.splitlines() if "=" in l}
    assert names == {
        "runs_dir",
        "runs_label",
        "start_steps",
        "end_steps",
        "smooth_steps",
        "command",
        "sweeps_dir",
        "sweeps_label",
        "numbers_json",
    }


@pytest.mark.slow
def test_offline_docs_site(rendered, tmp_path):
    "Two notebooks through nbdev's processing + nbconvert, the index and the report, linked by one nav bar."
    pages = R.build_docs(
        ROOT,
        tmp_path / "site",
        only=["15_settings.ipynb", "76_report.ipynb"],
        report_html=rendered / "math_hard_report.html",
    )
    names = sorted(p.name for p in pages)
    assert names == [
        "index.html",
        "math_hard_report.html",
        "report.html",
        "settings.html",
    ]  # no page overwrites another
    for p in pages:
        html = p.read_text()
        assert R.offline_violations(html) == []
        assert 'href="math_hard_report.html"' in html and 'href="settings.html"' in html
    assert 'id="numbers-table"' in (tmp_path / "site" / "math_hard_report.html").read_text()
    settings = (tmp_path / "site" / "settings.html").read_text()
    assert "get_setting" in settings and "#| export" not in settings


@pytest.mark.slow
def test_explore_notebook_loads_a_run(runs, tmp_path):
    "experiments/explore_run.ipynb runs on a testbed run folder and plots the DIS ratios and advantages."
    out = tmp_path / "explore.ipynb"
    R.run_notebook(
        ROOT / "experiments" / "explore_run.ipynb",
        out,
        {"run_dir": str(runs / "mini" / "sao" / "seed0")},
        cwd=str(ROOT / "experiments"),
    )
    nb = json.loads(out.read_text())
    pngs = [o for c in nb["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(pngs) == 2
    text = json.dumps(nb)
    assert "setting sao, seed 0, 60 steps" in text and "dis/ratio_p50" in text
    assert "kept rollouts from 7 steps (1..60)" in text and 'class=\\"sao-sample\\"' in text  # the samples section


def test_sweep_findings_section(runs, tmp_path):
    "--sweeps: each sweep's phenomena table, its values recomputed here from the run folders' metrics."
    import shutil
    import statistics
    from sao_repro.mini.sweep import format_results, load_sweep, sweep_results

    sc = load_sweep(
        {
            "name": "t",
            "settings": list(SETTINGS),
            "seeds": len(SEEDS),
            "steps": STEPS,
            "window": 20,
            "base": {"preset": "smoke", "difficulty": 1},
        }
    )
    shutil.copytree(runs / "mini", tmp_path / "sweeps" / "t" / "base" / "mini")
    res = sweep_results(sc, str(tmp_path))
    (tmp_path / "sweeps/t/results.json").write_text(json.dumps(res))
    (tmp_path / "sweeps/t/results.md").write_text("`sao-repro sweep t.yaml`\n\n" + format_results(res))
    out = tmp_path / "report"
    assert (
        R.report_main(
            ["--runs", str(runs), "--out", str(out), "--engine", "nbconvert", "--sweeps", str(tmp_path / "sweeps")]
        )
        == 0
    )
    p = Tables()
    p.feed((out / "math_hard_report.html").read_text())
    rows = {r[1]: r for r in p.tables["phenomena-t"][1:]}

    def heldout_end(s, k):  # mean of the evaluations inside the last 20 steps
        ms = [json.loads(l) for l in (runs / "mini" / s / f"seed{k}" / "metrics.jsonl").read_text().splitlines()]
        return statistics.mean(m["eval/acc"] for m in ms if "eval/acc" in m and m["step"] > STEPS - 20)

    d = [heldout_end("sao", k) - heldout_end("grpo", k) for k in SEEDS]
    half = T975[len(d) - 1] * statistics.stdev(d) / math.sqrt(len(d))
    assert rows["SAO above GRPO"][3] == R.fmt_ci(statistics.mean(d), half)
    verdict = (
        "reproduced"
        if statistics.mean(d) - half > 0
        else "opposite"
        if statistics.mean(d) + half < 0
        else "not resolved"
    )
    assert rows["SAO above GRPO"][4] == verdict

    def heldout_first(s, k):
        ms = [json.loads(l) for l in (runs / "mini" / s / f"seed{k}" / "metrics.jsonl").read_text().splitlines()]
        return next(m["eval/acc"] for m in ms if "eval/acc" in m)

    drop = [heldout_first("grpo", k) - heldout_end("grpo", k) for k in SEEDS]
    assert rows["GRPO collapses"][3] == R.fmt_ci(statistics.mean(drop), T975[1] * statistics.stdev(drop) / math.sqrt(2))
    assert rows["SAO above GRPO"][6] in ("reproduced", "opposite", "not resolved")  # the online verdict column
    html = (out / "math_hard_report.html").read_text()  # the sweep's figure: its one point's seed means, banded
    for prose in SWEEPS_PROSE:  # the prose about sweeps is there when sweeps are given
        assert prose in html, prose
    assert "No sweeps in this build" not in html
    if R.find_chromium():  # the default made the PDF too: its sweep tables read in whole words
        assert not broken_words(html, out / "math_hard_report.pdf")
    assert "Figure: sweep t" in re.sub(r"<[^>]+>", "", html) and R.band_text() in html
    from sao_repro import results  # the findings prose: rendered from its results file, stale banner and all

    text, rec = re.sub(r"<[^>]+>", "", html), results.load(results.find("findings"))
    assert "Findings so far, as written from the sweeps" in text and rec["command"].split(" && ")[0] in text
    assert ("Stale:" in text and "sao-repro results refresh findings" in text) == (results.status(rec) == "stale")
    assert len(re.findall(r'src="data:image/png;base64,', html)) == 4  # accuracy, DIS, critic and the sweep
    import matplotlib

    matplotlib.use("Agg")
    f = R.fig_sweep({"base": R.load_runs(tmp_path / "sweeps" / "t" / "base")[0]})
    check_panel(f.axes[0], runs, "eval/acc", 1, SETTINGS)
    assert R.report_main(["--runs", str(runs), "--out", str(out), "--sweeps", str(tmp_path / "nothing")]) == 1


A4_TEXT_MM = (210 - 2 * 12, 297 - 2 * 14)  # the report's @page: A4, margins 12 mm left/right, 14 mm top/bottom

TABLE_FIT_JS = """(() => [...document.querySelectorAll('table')].map(t => {
  const over = [];
  for (let e = t; e && e !== document.documentElement; e = e.parentElement)
    if (e.scrollWidth > e.clientWidth + 1) over.push(e.tagName + '.' + e.className + ' ' + e.scrollWidth + '>' + e.clientWidth);
  return {id: t.id, right: t.getBoundingClientRect().right, over: over};
}))()"""


def page_margin_ink(pdf, out_dir, dpi=50):
    "pdftoppm page images; per page, the darkest grey level inside the left / right page margins (255 = blank)."
    import subprocess
    from PIL import Image

    subprocess.run(["pdftoppm", "-r", str(dpi), "-png", str(pdf), str(out_dir / "page")], check=True)
    pages = sorted(out_dir.glob("page-*.png"))
    m = int(12 / 25.4 * dpi) - 2  # the margin, less 2 px of anti-aliasing
    res = []
    for p in pages:
        im = Image.open(p).convert("L")
        w, h = im.size
        res.append((p.name, im.crop((0, 0, m, h)).getextrema()[0], im.crop((w - m, 0, w, h)).getextrema()[0], (w, h)))
    return res


@pytest.mark.browser
def test_pdf_pages_hold_every_table_whole(rendered, tmp_path):
    "Printed on A4, no table is wider than the text block: laid out by Chromium in print media, and on the PDF's pages."
    from browser import open_page

    pdf = rendered / "math_hard_report.pdf"
    pages = page_margin_ink(pdf, tmp_path)
    assert len(pages) >= 3
    for name, left, right, (w, h) in pages:
        assert abs(w / h - 210 / 297) < 0.01, (name, w, h)  # A4
        assert left > 200 and right > 200, (
            f"{name}: ink in the page margin (a table or figure wider than the text block)"
        )
    width = round(A4_TEXT_MM[0] / 25.4 * 96)  # CSS px of the text block
    with open_page(width=width, height=1100) as page:
        page.emulate_media(media="print")
        page.goto((rendered / "math_hard_report.html").resolve().as_uri(), wait_until="load")
        tables = page.evaluate(TABLE_FIT_JS)
    assert {t["id"] for t in tables} >= {
        "headline-table",
        "numbers-table",
        "runs-table",
        "design-table",
        "distance-table",
    }
    for t in tables:
        assert t["right"] <= width + 1 and not t["over"], t


def test_figures_are_at_print_resolution(rendered):
    import base64
    import io
    from PIL import Image

    html = (rendered / "math_hard_report.html").read_text()
    pngs = [
        Image.open(io.BytesIO(base64.b64decode(b))) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    ]
    assert len(pngs) >= 3
    for im in pngs:
        assert round(im.info["dpi"][0]) >= 200, im.info
        assert im.width >= 1400  # 7 inches or more at 200 dpi: sharp across the text block


def test_first_screen_title_folded_provenance_and_relative_paths(rendered, runs):
    "Title from the runs; the headline figure and table come first; run commands folded; no absolute paths."
    html = (rendered / "math_hard_report.html").read_text()
    cfg = json.loads((runs / "mini" / "sao" / "seed0" / "config.json").read_text())
    title = f"SAO and the settings it is compared with: addition (CPU testbed, {cfg['warm_start']['model']['n_layers']}-layer transformer)"
    assert f"<title>{title}</title>" in html and "MATH-hard" not in title
    body = html.split("</style>")[-1]
    h1 = body.index("<h1")
    assert title in re.sub(r"<[^>]+>", "", body[h1 : body.index("</h1>")])
    assert h1 < body.index("data:image/png") < body.index('id="headline-table"') < body.index('id="design-table"')
    folded = re.findall(r"<details>(.*?)</details>", body, flags=re.S)
    assert len(folded) == 2 and folded[0].count("sao-repro run ") == len(SETTINGS) * len(SEEDS)  # 2nd: manifests
    assert body.count("sao-repro run ") == len(SETTINGS) * len(SEEDS)  # the commands appear only in the folded block
    assert str(runs.parent) not in html and "--out runs" in folded[0]
    assert "report --runs runs" in body


def test_headline_numbers_are_held_out_and_online_from_the_metrics(rendered, runs):
    "Held-out: first evaluation and the evaluations of the last 50 steps; online: first / last 50 steps; mean ± t CI."
    html = (rendered / "math_hard_report.html").read_text()
    rows = {r["setting"]: r for r in table(html, "headline-table")}

    def mci(xs):
        m = sum(xs) / len(xs)
        return m, T975[len(xs) - 1] * math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) / math.sqrt(len(xs))

    for s in SETTINGS:
        h0, h1, a0, a1 = [], [], [], []
        for k in SEEDS:
            ms = [json.loads(l) for l in (runs / "mini" / s / f"seed{k}" / "metrics.jsonl").read_text().splitlines()]
            ev = [(m["step"], m["eval/acc"]) for m in ms if m.get("eval/acc") is not None]
            h0.append(ev[0][1])
            h1.append(sum(v for st, v in ev if st > STEPS - 50) / sum(1 for st, v in ev if st > STEPS - 50))
            a0.append(sum(m["acc"] for m in ms if m["step"] <= 50) / sum(1 for m in ms if m["step"] <= 50))
            a1.append(
                sum(m["acc"] for m in ms if m["step"] > STEPS - 50) / sum(1 for m in ms if m["step"] > STEPS - 50)
            )
        fmt = lambda a, b: "{:.3f} ± {:.3f} -> {:.3f} ± {:.3f}".format(*mci(a), *mci(b))
        assert rows[s]["held-out accuracy: first evaluation -> last 50 steps"] == fmt(h0, h1)
        assert rows[s]["online accuracy: first 50 -> last 50 steps"] == fmt(a0, a1)
        assert rows[s]["seeds"] == "2" and rows[s]["steps"] == str(STEPS)


# The figures: seaborn's seed means and interval bands, checked against the run folders' metrics (data, not pixels)


def seed_curves(runs, setting, key, window):
    "{step: [value per seed]} of `key` in each seed's metrics.jsonl, each seed's values a rolling mean over `window` entries."
    by_step = {}
    for k in SEEDS:
        ms = [json.loads(l) for l in (runs / "mini" / setting / f"seed{k}" / "metrics.jsonl").read_text().splitlines()]
        pts = sorted((m["step"], float(m[key])) for m in ms if m.get(key) is not None)
        for i, (st, _) in enumerate(pts):
            last = [v for _, v in pts[max(0, i - window + 1) : i + 1]]
            by_step.setdefault(st, []).append(sum(last) / len(last))
    return dict(sorted(by_step.items()))


def t_band(xs):
    m = sum(xs) / len(xs)
    h = T975[len(xs) - 1] * math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) / math.sqrt(len(xs))
    return m - h, m + h


def check_panel(ax, runs, key, window, settings):
    "One line per setting in its colour, y = the seed-wise mean; one band per line spanning the t interval over seeds."
    import numpy as np
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgb
    from sao_repro.settings import SETTING_COLORS

    assert [l.get_label() for l in ax.lines] == list(settings)
    assert len(ax.collections) == len(ax.lines)
    for line, band, s in zip(ax.lines, ax.collections, settings):
        assert line.get_color() == SETTING_COLORS[s]
        assert isinstance(band, PolyCollection) and np.allclose(band.get_facecolor()[0][:3], to_rgb(SETTING_COLORS[s]))
        curves = seed_curves(runs, s, key, window)
        assert list(line.get_xdata()) == list(curves)
        assert np.allclose(line.get_ydata(), [sum(v) / len(v) for v in curves.values()])
        verts = band.get_paths()[0].vertices
        for st, vals in curves.items():
            if len(vals) == len(SEEDS):
                ys = verts[verts[:, 0] == st][:, 1]
                lo, hi = t_band(vals)
                assert ys.min() == pytest.approx(lo, abs=1e-4) and ys.max() == pytest.approx(hi, abs=1e-4), (
                    s,
                    key,
                    st,
                )  # T975: 3 decimals
    from sao_repro.report.figures import setting_style

    assert [l.get_marker() for l in ax.lines] == [setting_style(s)[1] for s in settings]
    assert len({l.get_marker() for l in ax.lines}) == len(ax.lines)  # apart in grayscale print too
    assert [l.get_linestyle() == "-" for l in ax.lines] == [s == "sao" for s in settings]  # the others dashed


def test_figures_are_seed_means_with_t_bands(runs):
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    df, _ = R.load_runs(runs)
    f = R.fig_accuracy(df, 10)
    check_panel(f.axes[0], runs, "acc", 10, SETTINGS)
    check_panel(f.axes[1], runs, "eval/acc", 1, SETTINGS)  # held-out: each evaluation, averaged over seeds
    assert [t.get_text() for t in f.axes[0].get_legend().texts] == list(SETTINGS)
    f = R.fig_dis(df, 5)
    check_panel(f.axes[1], runs, "dis/masked_below_frac", 5, ["sao"])  # grpo has no DIS band
    f = R.fig_critic(df, 3)
    check_panel(f.axes[0], runs, "critic/explained_var", 3, ["sao"])
    check_panel(f.axes[1], runs, "critic/value_loss", 3, ["sao"])
    plt.close("all")


def test_figure_captions_name_the_interval(rendered):
    text = re.sub(r"<[^>]+>", "", (rendered / "math_hard_report.html").read_text())
    band = "band: 95% CI over seeds (mean ± t·sd/√n, Student t)"
    assert R.band_text() == band
    for fig in ("Figure 1: accuracy per setting", "Figure 2: DIS masked fractions", "Figure 3: critic diagnostics"):
        assert f"{fig}, mean over seeds ({band})" in text, fig
    assert "min–max" not in text


def test_design_table_says_the_band_each_setting_used(rendered):
    "The design table's band column: the preset and band from the runs' config.json (here the registry's reference)."
    rows = {r["setting"]: r for r in table((rendered / "math_hard_report.html").read_text(), "design-table")}
    assert rows["sao"]["band"] == "reference [0.3, 5]" and rows["grpo"]["band"] == "-"


def test_design_table_band_column_reads_config_json(tmp_path):
    "Runs of one setting with two bands (paper-math from a preset, reference from numbers) both show, by name."
    from sao_repro.settings import get_setting

    for seed, spec in ((0, {"dis_band": [0.7, 6.0], "dis_preset": "paper-math"}), (1, {"dis_band": [0.3, 5.0]})):
        d = tmp_path / "mini" / "single_dis" / f"seed{seed}"
        d.mkdir(parents=True)
        s = get_setting("single_dis").to_dict() | spec
        s.pop("dis_preset") if "dis_preset" not in spec else None
        (d / "config.json").write_text(
            json.dumps({"setting": "single_dis", "seed": seed, "backend": "mini", "setting_spec": s})
        )
        (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "acc": 0.5}) + "\n")
    _, runs_df = R.load_runs(tmp_path)
    d = R.design_table(runs_df=runs_df).set_index("setting")
    assert d.loc["single_dis", "band"] == "paper-math [0.7, 6]; reference [0.3, 5]"
    assert d.loc["sao", "band"] == "reference [0.3, 5]"  # no runs: the registry's


def test_report_lists_what_each_run_folder_holds(rendered, runs):
    "Every run of the study holds a manifest, kept samples and TensorBoard scalars, as read back from its files."
    from sao_repro.tblog import read_scalars

    rows = {r["run"]: r for r in table((rendered / "math_hard_report.html").read_text(), "run-files-table")}
    assert len(rows) == len(SETTINGS) * len(SEEDS)
    for s in SETTINGS:
        for k in SEEDS:
            d, row = runs / "mini" / s / f"seed{k}", rows[f"mini/{s}/seed{k}"]
            assert row["manifest"].startswith("manifest.json (")
            assert row["kept samples"] != "none" and row["TensorBoard"] != "none"
            assert row["TensorBoard"].startswith(f"{len(read_scalars(d / 'tensorboard'))} tags, steps 1-{STEPS}")


def test_report_shows_kept_samples_escaped(rendered, runs):
    "The report shows the kept samples of one run per setting, their last kept step, every text escaped."
    from sao_repro.samples import last_step_samples

    html = (rendered / "math_hard_report.html").read_text()
    assert "Kept samples" in html
    assert html.count('<div class="sao-sample" ') == 2 * len(SETTINGS)  # 2 rows of one run per setting
    for s in SETTINGS:
        recs = last_step_samples(runs / "mini" / s / "seed0")
        assert [r["step"] for r in recs] == [STEPS] * 2  # default knobs: step 1 and every 10th
        head = f"step {STEPS}, row {recs[0]['row']}: reward {recs[0]['reward']} ({recs[0]['verdict']})"
        assert head in html
    assert "&lt;eos&gt;" in html and "<eos>" not in html  # token texts escaped


def test_mismatch_table_per_setting_from_the_metrics(rendered, runs):
    "One row per setting; the k3 KL over all tokens and the lag are those of the runs' own mismatch/ keys."
    html = (rendered / "math_hard_report.html").read_text()
    rows = {r["setting"]: r for r in table(html, "mismatch-table")}
    assert set(rows) == set(SETTINGS)
    df = collect_metrics(runs)
    for s in SETTINGS:
        mine = df[(df.setting == s)]
        k3_all = mine[mine.metric == "mismatch/k3_kl_all"].value.astype(float)
        assert rows[s]["k3_kl_all mean"] == f"{k3_all.mean():.2e}"
        assert rows[s]["lag max"] == f"{mine[mine.metric == 'mismatch/lag_max'].value.max():.3f}" == "3.000"
        k3 = mine[mine.metric == "mismatch/k3_kl"].value
        assert rows[s]["measured"] == f"{len(k3)} / {STEPS * len(SEEDS)}" and len(k3) == len(
            SEEDS
        )  # lag 0 at step 1 only


# The PDF as a reader meets it: its text (pdftotext) in whole words, its pages (pdftoppm) without half-blank pages or
# headings left at a page's foot; the formats made with and without Chromium.

SWEEPS_PROSE = (
    "Findings so far: what the testbed reproduces of the reference study",
    "Each phenomenon of the reference study",
)


def pdf_pages(pdf):
    "The text of each page of `pdf` (pdftotext, reading order)."
    import subprocess

    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    n = int(re.search(r"^Pages:\s+(\d+)", info, flags=re.M).group(1))
    return [
        subprocess.run(
            ["pdftotext", "-f", str(i), "-l", str(i), str(pdf), "-"], capture_output=True, text=True, check=True
        ).stdout
        for i in range(1, n + 1)
    ]


def words(text):
    "The words of a text: runs of letters, digits and `_ / . =` holding a letter (a compound broken at its own hyphen, which pdftotext joins, counts whole)."
    text = re.sub(r"(?<=\w)-(?=\w)", "", text)
    return re.findall(r"[A-Za-z0-9_/.=]*[A-Za-z][A-Za-z0-9_/.=]*", text)


def html_text(html):
    "The text a printed page of the report shows: the body without styles and the folded <details> blocks."
    import html as H

    body = html.split("</style>")[-1]
    body = re.sub(r"<details>.*?</details>", " ", body, flags=re.S)
    return H.unescape(re.sub(r"<[^>]+>", " ", body)).replace("\u00b6", " ")


def table_words(html):
    "The words in the cells and headers of the report's tables (those it computes: each has an id)."
    import html as H

    tables = re.findall(r"<table[^>]*\bid=[^>]*>(.*?)</table>", html.split("</style>")[-1], flags=re.S)
    return {
        w
        for t in tables
        for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", t, flags=re.S)
        for w in words(H.unescape(re.sub(r"<[^>]+>", " ", c)))
    }


def broken_words(html, pdf):
    "The table words fewer times whole in the PDF's text than on the page: {word: (on the page, in the PDF)}."
    from collections import Counter

    in_pdf, in_html = Counter(words(" ".join(pdf_pages(pdf)))), Counter(words(html_text(html)))
    return {w: (in_html[w], in_pdf[w]) for w in table_words(html) if len(w) > 1 and in_pdf[w] < in_html[w]}


def page_ink_bottoms(pdf, out_dir, dpi=40):
    "Per page, how far down its lowest non-white pixel row lies (0 = a blank page, 1 = the bottom edge)."
    import subprocess
    from PIL import Image

    subprocess.run(["pdftoppm", "-r", str(dpi), "-gray", "-png", str(pdf), str(out_dir / "ink")], check=True)
    res = []
    for p in sorted(out_dir.glob("ink-*.png")):
        im = Image.open(p).convert("L")
        rows = [y for y in range(im.height) if im.crop((0, y, im.width, y + 1)).getextrema()[0] < 200]
        res.append((max(rows) + 1) / im.height if rows else 0.0)
    return res


def heading_blocks(html, executed_nb):
    "The word lists a page must not end with: each heading, and each markdown cell led by a heading (the heading with its intro)."
    import html as H

    heads = [
        words(H.unescape(re.sub(r"<[^>]+>", " ", h)).replace("\u00b6", " "))
        for h in re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", html.split("</style>")[-1], flags=re.S)
    ]
    cells = json.loads(Path(executed_nb).read_text())["cells"]
    intros = [
        words("".join(c["source"]))
        for c in cells
        if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("#")
    ]
    return [b for b in heads + intros if b]


@pytest.mark.browser
def test_default_format_makes_a_pdf(rendered):
    "`sao-repro report` without --format (the README's command) writes the PDF beside the HTML where Chromium is."
    pdf = rendered / "math_hard_report.pdf"
    assert pdf.read_bytes()[:5] == b"%PDF-"


@pytest.mark.browser
def test_pdf_reads_in_whole_words(rendered, runs):
    "No table breaks a word: every word of every table cell and header is as often whole in the PDF's text as on the page."
    html = (rendered / "math_hard_report.html").read_text()
    text = " ".join(pdf_pages(rendered / "math_hard_report.pdf"))
    paths = {f"mini/{s}/seed{k}" for s in SETTINGS for k in SEEDS}
    names = set(R.design_table().setting)  # every setting name of the registry's comparison (the design table's rows)
    assert names | paths | {"running_mean", "batch_norm", "flags", "seed"} <= table_words(html)  # what the check covers
    broken = broken_words(html, rendered / "math_hard_report.pdf")
    assert not broken, f"words broken in the PDF (on the page, whole in the PDF): {broken}"
    for w in names | paths:
        assert re.search(rf"(?<!\S){re.escape(w)}(?!\S)", text), w
    assert not re.search(r"running_\s+mean|advantag\s+e|mini/grp\s+o/", text)


@pytest.mark.browser
def test_pdf_pages_are_full_and_keep_headings_with_what_follows(rendered, tmp_path):
    "No page but the last is half blank (its lowest ink below the middle); no page ends with a heading, or a heading and its intro."
    pdf = rendered / "math_hard_report.pdf"
    bottoms = page_ink_bottoms(pdf, tmp_path)
    pages = pdf_pages(pdf)
    assert len(bottoms) == len(pages) >= 3
    assert all(b >= 0.5 for b in bottoms[:-1]), f"a page left half blank (lowest ink per page, 1 = its foot): {bottoms}"
    blocks = heading_blocks((rendered / "math_hard_report.html").read_text(), rendered / "math_hard_report.ipynb")
    assert len(blocks) >= 8
    for i, page in enumerate(pages[:-1], 1):
        ws = words(page)
        for b in blocks:
            assert ws[-len(b) :] != b, f"page {i} ends with {' '.join(b)!r}; its content is on the next page"


@pytest.mark.browser
def test_pdf_has_no_sweeps_prose_without_sweeps(rendered):
    "Without --sweeps the findings section says there are none, and none of the prose about sweeps is printed."
    text = re.sub(r"\s+", " ", " ".join(pdf_pages(rendered / "math_hard_report.pdf")))
    html = (rendered / "math_hard_report.html").read_text()
    assert "No sweeps in this build" in text
    for prose in SWEEPS_PROSE:
        assert prose not in text and prose not in html, prose


def test_explicit_pdf_without_chromium_is_an_error(runs, tmp_path, monkeypatch, capsys):
    "--format pdf (or html,pdf) where Chromium is missing: exit 1, a message naming Chromium and its install, nothing built."
    from sao_repro.cli import main

    monkeypatch.setenv("CHROMIUM", str(tmp_path / "no-such-chrome"))  # the binary the report would use: none
    for fmt in ("pdf", "html,pdf"):
        assert main(["report", "--runs", str(runs), "--out", str(tmp_path / "out"), "--format", fmt]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Chromium" in err and "apt-get install -y chromium" in err, err
    assert not (tmp_path / "out").exists()
    assert (
        main(["report", "--runs", str(runs), "--out", str(tmp_path / "out"), "--screenshot", str(tmp_path / "s.png")])
        == 1
    )
    assert "Chromium" in capsys.readouterr().err


@pytest.fixture(scope="module")
def healthy(runs, tmp_path_factory):
    "grpo runs only (no SAO health flag can be set), reported by default where Chromium is missing: (out folder, stdout, exit code)."
    import contextlib
    import io
    import shutil

    root = tmp_path_factory.mktemp("healthy")
    shutil.copytree(runs / "mini" / "grpo", root / "runs" / "mini" / "grpo")
    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buf):
        mp.chdir(root)
        mp.setenv("CHROMIUM", str(root / "no-such-chrome"))
        rc = R.report_main(["--runs", "runs", "--out", "out", "--engine", "nbconvert"])
    return root, buf.getvalue(), rc


def test_default_without_chromium_writes_html_and_a_note(healthy):
    "No Chromium: the default is the HTML alone, exit 0, and one line saying the PDF was skipped and how to install Chromium."
    root, out, rc = healthy
    assert rc == 0
    assert (root / "out" / "math_hard_report.html").exists() and not (root / "out" / "math_hard_report.pdf").exists()
    notes = [l for l in out.splitlines() if "PDF" in l]
    assert (
        len(notes) == 1 and notes[0].startswith("report: PDF skipped:") and "apt-get install -y chromium" in notes[0]
    ), out
    rows = table((root / "out" / "math_hard_report.html").read_text(), "health-table")
    assert rows == [{"run": "none"}]  # the header, then one row saying none


@pytest.mark.browser
def test_empty_table_says_none_in_the_pdf(healthy, monkeypatch, capsys, tmp_path):
    "The same report where Chromium is: the HTML is reused and printed; the empty health-flag table reads `none`."
    root, _, _ = healthy
    monkeypatch.chdir(root)
    assert R.report_main(["--runs", "runs", "--out", "out", "--engine", "nbconvert"]) == 0
    assert "inputs unchanged, reused" in capsys.readouterr().out
    text = " ".join(pdf_pages(root / "out" / "math_hard_report.pdf"))
    section = re.search(r"\nHealth flags\n(.*?)Table: SAO health flags", text, flags=re.S)
    assert section, text
    # the table's header and its one cell `none` (the text's order follows the PDF's layout, not the table's)
    assert re.findall(r"\b(run|setting|seed|flags|none)\b", section.group(1)[section.group(1).index("\nrun") :]) in (
        ["run", "setting", "seed", "flags", "none"],
        ["run", "none", "setting", "seed", "flags"],
    ), section.group(1)
    assert all(b >= 0.5 for b in page_ink_bottoms(root / "out" / "math_hard_report.pdf", tmp_path)[:-1])


# Outputs land in the output folder only: never through a link planted there, and `--out` naming a file is one line.


def test_report_never_writes_through_a_link_planted_in_its_folder(runs, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    victims = {}
    for name in ("math_hard_report.html", "numbers.json", ".report_key", "math_hard_report.ipynb"):
        v = tmp_path / f"victim-{name}"
        v.write_text("not yours")
        (out / name).symlink_to(v)
        victims[name] = v
    assert R.report_main(["--runs", str(runs), "--out", str(out), "--format", "html", "--engine", "nbconvert"]) == 0
    assert all(v.read_text() == "not yours" for v in victims.values())
    assert (
        not any((out / n).is_symlink() for n in victims) and "sao-table" in (out / "math_hard_report.html").read_text()
    )
    assert "removed the link" in capsys.readouterr().out


def test_report_out_naming_a_file_is_one_line(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    p = subprocess.run(
        [sys.executable, "-m", "sao_repro.cli", "report", "--runs", str(tmp_path), "--out", str(f)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"--out {f}: that is a file" in p.stderr and f.read_text() == "x"


# ---------------------------------------------------------------- names and numbers no reader can take; many runs


def plain_text(html):
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#177;", "±")


def test_report_skips_names_not_utf8_and_numbers_no_float_holds_and_clips_extremes(tmp_path, capsys):
    "Folders not UTF-8 at each depth, a line with a 400-digit integer, values of ±1e308: the report is built, says what it clipped."
    import os
    import shutil
    from sao_repro.report.bench import fabricate_runs

    runs = fabricate_runs(tmp_path / "runs", 6, steps=12)  # the five settings, and sao seed 1
    root = os.fsencode(runs)
    for bad in (b"/mini/grpo/se\xffed0", b"/mini/gr\xffpo/seed0", b"/m\xffini/sao/seed0", b"/mini/sao/seed0/sub\xff"):
        os.makedirs(root + bad)
        shutil.copy(runs / "mini" / "sao" / "seed0" / "metrics.jsonl", root + bad + b"/metrics.jsonl")
    with open(runs / "mini" / "grpo" / "seed0" / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "acc": 1%s}\n{"step": 14, "acc": 0.5}\n' % ("0" * 400))
    p = runs / "mini" / "sao" / "seed1" / "metrics.jsonl"
    ms = [json.loads(l) for l in p.read_text().splitlines()]
    ms[3]["acc"], ms[4]["acc"] = 1e308, -1e308
    p.write_text("".join(json.dumps(m) + "\n" for m in ms))
    with pytest.warns(UserWarning, match="not UTF-8"):
        rc = R.report_main(
            ["--runs", str(runs), "--out", str(tmp_path / "out"), "--format", "html", "--engine", "nbconvert"]
        )
    assert rc == 0, capsys.readouterr().err
    text = plain_text((tmp_path / "out" / "math_hard_report.html").read_text())
    assert "acc of mini/sao/seed1 : 2 value(s) beyond ±1e+12" in text, text[:3000]  # named under Figure 1
    numbers = {n["setting"]: n for n in json.loads((tmp_path / "out" / "numbers.json").read_text())}
    assert numbers["grpo"]["runs"] == ["mini/grpo/seed0"] and numbers["sao"]["seeds"] == 2
    with pytest.warns(UserWarning, match="not UTF-8"):
        df, runs_df = R.load_runs(runs)
    assert len(runs_df) == 6 and df.attrs["skipped"]["mini/grpo/seed0"]["garbled"] == 1
    assert df[(df.run == "mini/grpo/seed0") & (df.metric == "acc")].step.max() == 14  # the line after it is read
    f = R.fig_accuracy(df, 3)
    assert f.notes == [{"metric": "acc", "run": "mini/sao/seed1", "clipped": 2, "limit": f.notes[0]["limit"]}]
    assert all(abs(y) <= f.notes[0]["limit"] for l in f.axes[0].lines for y in l.get_ydata())


@pytest.mark.slow
def test_report_on_300_fabricated_runs_draws_one_line_per_setting(tmp_path):
    "300 runs: the report is built; each panel is one line and one band per setting, the mean over its 60 seeds per step."
    import numpy as np
    from sao_repro.metrics import smooth
    from sao_repro.report.bench import fabricate_runs
    from sao_repro.settings import list_settings

    runs = fabricate_runs(tmp_path / "runs", 300, steps=30)
    assert (
        R.report_main(
            ["--runs", str(runs), "--out", str(tmp_path / "out"), "--format", "html", "--engine", "nbconvert"]
        )
        == 0
    )
    numbers = json.loads((tmp_path / "out" / "numbers.json").read_text())
    five = list_settings("comparison")  # what fabricate_runs makes
    assert sorted(n["setting"] for n in numbers) == sorted(five) and {n["seeds"] for n in numbers} == {60}
    df, _ = R.load_runs(runs)
    ax = R.fig_accuracy(df, 10).axes[0]
    assert [l.get_label() for l in ax.lines] == five and len(ax.collections) == len(ax.lines)
    want = smooth(df[df.metric == "acc"], 10).groupby(["setting", "step"]).value.agg(["mean", "std", "count"])
    for line, band in zip(ax.lines, ax.collections):
        w = want.loc[line.get_label()]
        assert list(line.get_xdata()) == list(w.index) and np.allclose(line.get_ydata(), w["mean"])
        lo, hi = t_band_of(w.loc[15])
        ys = band.get_paths()[0].vertices
        ys = ys[ys[:, 0] == 15][:, 1]
        assert ys.min() == pytest.approx(lo) and ys.max() == pytest.approx(hi)


def t_band_of(row):
    from scipy.stats import t

    h = t.ppf(0.975, row["count"] - 1) * row["std"] / math.sqrt(row["count"])
    return row["mean"] - h, row["mean"] + h


# ---------------------------------------------------------------- hostile names and values in the report
EVIL = "x` <img src=x onerror=alert(1)> `<script>alert(2)</script>"


@pytest.mark.slow
def test_report_escapes_hostile_names_and_values_and_forbids_scripts(tmp_path):
    from html.parser import HTMLParser
    from sao_repro import report as R

    runs = tmp_path / "runs"
    for setting in ("sao", EVIL.replace("/", "_")):
        d = runs / "mini" / setting / f"seed0{EVIL.replace('/', '_')}"
        _write_metrics(d / "metrics.jsonl", range(1, 9))
        (d / "config.json").write_text(
            json.dumps(
                {
                    "setting": setting,
                    "seed": 0,
                    "backend": "mini",
                    "ops": EVIL,
                    "difficulty": EVIL,
                    "lag": EVIL,
                    "trajectories_per_step": 16,
                }
            )
        )
    (runs / "mini" / "summary.md").write_text(f"`sao-repro compare --out {EVIL}`\n")
    out = tmp_path / f"report{EVIL.replace('/', '_')}"
    assert R.report_main(["--runs", str(runs), "--out", str(out), "--format", "html", "--engine", "nbconvert"]) == 0
    page = next(out.glob("*.html")).read_text()

    class Tags(HTMLParser):
        found = []

        def handle_starttag(self, tag, attrs):
            self.found.append((tag, dict(attrs)))

    Tags().feed(page)
    handlers = [(t, k) for t, a in Tags.found for k in a if k.lower().startswith("on")]
    assert handlers == []  # no inline event handler made it into the page
    assert not [a for t, a in Tags.found if t == "img" and a.get("src") == "x"]
    assert "alert(2)" not in [s for t, a in Tags.found if t == "script" for s in [a.get("src", "")]]
    assert "<script>alert(2)</script>" not in page
    csp = [a["content"] for t, a in Tags.found if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "script-src 'none'" in csp[0] and "default-src 'none'" in csp[0]
    assert "alert(1)" in page  # the hostile text is shown, as text


# ---------------------------------------------------------------- the report's provenance lines
def _toy_study(runs, settings=("sao", "grpo"), seeds=(0, 1, 2), steps=60):
    "Run folders as the testbed writes them (config.json, metrics.jsonl), with made-up but well-formed numbers."
    for s in settings:
        for k in seeds:
            d = runs / "mini" / s / f"seed{k}"
            d.mkdir(parents=True)
            (d / "config.json").write_text(
                json.dumps(
                    {
                        "setting": s,
                        "seed": k,
                        "backend": "mini",
                        "steps": steps,
                        "trajectories_per_step": 16,
                        "out": str(runs),
                    }
                )
            )
            rows = [
                {
                    "step": i,
                    "acc": (i + k) % 5 / 5,
                    "correct": (i + k) % 5,
                    "incorrect": 5 - (i + k) % 5,
                    "reward/mean": (i % 4) / 4,
                    "dis/masked_below_frac": 0.1,
                    "dis/masked_above_frac": 0.02,
                    "dis/kept_frac": 0.88,
                    "rollout/resp_len": 3.0,
                    **({"critic/explained_var": 0.3, "critic/value_loss": 0.2} if s == "sao" else {}),
                    **({"eval/acc": 0.2 + 0.01 * k + 0.001 * i} if i % 20 == 0 or i == steps else {}),
                }
                for i in range(1, steps + 1)
            ]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.slow
def test_report_provenance_is_code_compact_and_relative(tmp_path, monkeypatch):
    from sao_repro.report import report_main

    runs, out, elsewhere = tmp_path / "study" / "runs", tmp_path / "study" / "report", tmp_path / "elsewhere"
    _toy_study(runs)
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the runs are outside the current folder, given as absolute paths
    assert report_main(["--runs", str(runs), "--out", str(out), "--engine", "nbconvert"]) == 0
    html = (out / "math_hard_report.html").read_text()
    lines = re.findall(r"run folders:(.*?)Made(.*?)</p>", html, flags=re.S)
    assert len(lines) >= 6
    assert "<code></code>" not in html
    for folders, made in lines:
        assert (
            folders.strip().startswith("<code>runs/mini/") and "<code>sao-repro report --runs runs --out report" in made
        )
    assert "<code>runs/mini/{grpo,sao}/seed{0,1,2}</code>" in html  # six folders in one pattern
    assert "<code>runs/mini/sao/seed{0,1,2}</code>" in html  # the DIS and critic figures: sao only
    assert not re.search(r"mini/(sao|grpo)/seed\d", html.split("<details>")[0].split("</style>")[-1])  # none one by one
    for absolute in (str(tmp_path), str(Path.home()), "/tmp/"):
        assert absolute not in html, absolute
