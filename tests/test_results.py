"""Results files (sao_repro.results): every quoted result committed in the repository is complete and rendered by a
page; a change to the code behind one makes it stale, and the page then names the command that refreshes it."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from sao_repro.report.docs import RESULT_CALL  # the cells the docs build renders
from sao_repro.results import (
    REQUIRED,
    RESULTS_DIRS,
    UNRECORDED,
    fingerprint,
    load,
    markdown,
    record,
    refresh_command,
    render,
    results_files,
    results_main,
    status,
)

ROOT = Path(__file__).resolve().parents[1]


def shown_by_pages() -> dict[str, list[str]]:
    "result name -> the notebooks (docs pages, the report) whose code cells call `results.show(name)`."
    out = {}
    for nb in sorted(ROOT.glob("nbs/*.ipynb")) + sorted(ROOT.glob("report/*.ipynb")):
        for c in json.loads(nb.read_text())["cells"]:
            if c["cell_type"] == "code":
                for name in RESULT_CALL.findall("".join(c["source"])):
                    out.setdefault(name, []).append(nb.relative_to(ROOT).as_posix())
    return out


def test_every_committed_results_file_is_complete_and_rendered_by_a_page():
    files = results_files(ROOT)
    assert files, f"no results files in {RESULTS_DIRS}"
    committed = subprocess.run(
        ["git", "ls-files", *RESULTS_DIRS], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    shown = shown_by_pages()
    for f in files:
        assert f.relative_to(ROOT).as_posix() in committed, f"{f} is not committed"
        rec = load(f)
        assert all(rec[k] for k in ("command", "commit", "fingerprint", "markdown", "sources")), f
        assert rec["name"] == f.stem and set(REQUIRED) <= set(rec)
        assert re.fullmatch(r"[0-9a-f]{7,40}", rec["commit"]), f"{f}: commit {rec['commit']!r}"
        assert re.fullmatch(r"[0-9a-f]{64}", rec["fingerprint"]) or rec["fingerprint"] == UNRECORDED, f
        assert all((ROOT / s).exists() for s in rec["sources"]), f"{f}: a source is missing: {rec['sources']}"
        assert f.stem in shown, f"{f} is rendered by no notebook: call results.show({f.stem!r}) where it is quoted"
        page = markdown(f.stem, ROOT)
        assert page.endswith(rec["markdown"]) and rec["command"] in page
        if status(rec, ROOT) == "stale":  # the page says so by itself, with the commit and the refresh command
            assert (
                page.startswith("> **Stale:**")
                and f"`{rec['commit'][:10]}`" in page
                and refresh_command(f.stem) in page
            )
    assert set(shown) <= {f.stem for f in files}, "a page shows a result that has no file"


def test_a_result_made_before_fingerprints_is_stale_with_its_commit():
    for f in results_files(ROOT):
        rec = load(f)
        if rec["fingerprint"] == UNRECORDED:
            assert status(rec, ROOT) == "stale" and f"made at commit `{rec['commit'][:10]}`" in render(rec, ROOT)


def test_a_changed_source_makes_a_result_stale_in_a_copy(tmp_path):
    "In a copy of the study's code: fresh when recorded, stale after an edit of one source file, fresh again after undoing it."
    from sao_repro.mini.cli import STUDY_SOURCES

    for s in STUDY_SOURCES:
        src, dst = ROOT / s, tmp_path / s
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy2(src, dst)
    assert fingerprint(STUDY_SOURCES, tmp_path) == fingerprint(STUDY_SOURCES, ROOT)  # content, not place
    cmd = "sao-repro compare --seeds 3 --out runs --record nbs/results/study.json"
    rec = record(tmp_path / "nbs" / "results" / "study.json", cmd, STUDY_SOURCES, "| t |\n|---|\n| 1 |", root=tmp_path)
    assert status(rec, tmp_path) == "fresh" and "Stale" not in render(rec, tmp_path)
    points = tmp_path / "sao_repro" / "mini" / "points.py"  # run_windows: the windows every table of the study reads
    before = points.read_text()
    points.write_text(before.replace("def run_windows(", "def run_windows(  ", 1))
    assert status(load(tmp_path / "nbs" / "results" / "study.json"), tmp_path) == "stale"
    page = render(rec, tmp_path)
    assert page.startswith("> **Stale:**") and "`sao-repro results refresh study`" in page and f"`{cmd}`" in page
    points.write_text(before)
    assert status(rec, tmp_path) == "fresh"


def test_results_command_lists_and_refreshes(tmp_path, capsys):
    (tmp_path / "code.py").write_text("x = 1\n")
    cmd = (
        f'{sys.executable} -c "from sao_repro.results import record; '
        "record('nbs/results/r.json', 'make r', ['code.py'], 'new', root='.')\""
    )
    record(tmp_path / "nbs" / "results" / "r.json", cmd, ["code.py"], "old", root=tmp_path)
    (tmp_path / "code.py").write_text("x = 2\n")
    assert results_main(["--root", str(tmp_path)]) == 0
    assert re.match(r"r\s+stale\s", capsys.readouterr().out)
    assert results_main(["refresh", "r", "--root", str(tmp_path)]) == 0
    assert load(tmp_path / "nbs" / "results" / "r.json")["markdown"] == "new\n"
    results_main(["--root", str(tmp_path)])
    assert re.search(r"^r\s+fresh\s", capsys.readouterr().out, flags=re.M)
