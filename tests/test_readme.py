"""README.md is generated from nbs/index.ipynb: it is what the notebook gives, the notebook's outputs are what its
commands print, nbdev's own commands write the same text, and every link and `make` target it names exists."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path


from sao_repro.report import docs as D

ROOT = Path(__file__).resolve().parent.parent


def test_readme_is_what_the_index_notebook_gives():
    assert D.readme_problems(ROOT) == []


def test_readme_check_fails_on_a_hand_edit(tmp_path):
    (tmp_path / "nbs").mkdir()
    shutil.copy(ROOT / D.README_NB, tmp_path / D.README_NB)
    (tmp_path / "README.md").write_text((ROOT / "README.md").read_text() + "one more line\n")
    probs = D.readme_problems(tmp_path)
    assert probs and "sao-repro docs --readme" in probs[0] and "-one more line" in probs
    assert D.docs_main(["--root", str(tmp_path), "--check-readme"]) == 1


def _outputs(nb: dict) -> list[str]:
    return [
        "".join(
            "".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) for o in c["outputs"]
        ).replace("\r\n", "\n")
        for c in nb["cells"]
        if c["cell_type"] == "code"
    ]


def test_index_outputs_are_what_its_commands_print(tmp_path):
    "The saved outputs (the settings table) come from running the cells, not from typing."
    (tmp_path / "nbs").mkdir()
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copy(ROOT / D.README_NB, tmp_path / D.README_NB)
    saved = json.loads((ROOT / D.README_NB).read_text())
    D.run_index(tmp_path, log=lambda *a: None)
    fresh = json.loads((tmp_path / D.README_NB).read_text())
    assert _outputs(fresh) == _outputs(saved)
    assert all(_outputs(saved)), "every code cell of the index has a saved output"
    from sao_repro.settings import list_settings

    table = _outputs(saved)[0]
    assert [l.split()[0] for l in table.split("\n\n")[0].splitlines()[1:]] == list(
        list_settings()
    )  # the first block: the settings
    assert table in D.readme_markdown(ROOT).replace("\n    ", "\n")


def _quarto_as_pandoc(cmd):
    """Run nbdev-readme's `quarto render NB -o README.md -t gfm ...` as Quarto does, without its binary: the notebook as
    markdown (Quarto's own reader; here nbconvert's), then pandoc (which Quarto bundles) to gfm with the filters the
    notebooks' `_metadata.yml` adds (the project's extensions), wrap preserved."""
    import yaml
    from nbconvert import MarkdownExporter

    cache, nb = re.match(r'cd "([^"]+)" && quarto render "([^"]+)" -o README\.md -t gfm ', cmd).groups()
    cache = Path(cache)
    lua = []
    for name in yaml.safe_load((cache / "_metadata.yml").read_text())["filters"]:
        ext = cache / "_extensions" / name
        lua += [ext / f for f in yaml.safe_load((ext / "_extension.yml").read_text())["contributes"]["filters"]]
    (cache / "index.quarto.md").write_text(MarkdownExporter().from_filename(nb)[0])
    args = [D.find_pandoc(), "-f", "markdown", "index.quarto.md", "-t", "gfm", "--wrap=preserve", "-o", "README.md"]
    subprocess.run(args + [a for f in lua for a in ("--lua-filter", str(f))], cwd=cache, check=True)


def test_nbdev_commands_leave_the_readme_alone(monkeypatch, tmp_path):
    """nbdev's settings name the real front page, and nbdev-readme (run by nbdev-prepare), through nbdev's own
    processing and cache, writes README.md as the same bytes `sao-repro docs --readme` gives."""
    import nbdev.quarto as Q
    from nbdev.config import get_config

    cfg = get_config(ROOT)
    assert (cfg.nbs_path / cfg.readme_nb) == ROOT / D.README_NB
    assert D.find_pandoc(), "needs pandoc (pip install pypandoc-binary, in the dev extra)"
    proj = tmp_path / "proj"
    (proj / "nbs").mkdir(parents=True)
    for f in ("pyproject.toml", D.README_NB, "nbs/_metadata.yml"):
        shutil.copy(ROOT / f, proj / f)
    shutil.copytree(ROOT / "nbs/_extensions", proj / "nbs/_extensions")
    (proj / "README.md").write_text("an old README\n")
    monkeypatch.setattr(Q, "_sprun", _quarto_as_pandoc)
    monkeypatch.chdir(proj)
    Q.refresh_quarto_yml()  # what nbdev-prepare does first: nbs/nbdev.yml and nbs/_quarto.yml
    Q.nbdev_readme.__wrapped__(path=str(proj))
    assert (proj / "README.md").read_text() == D.readme_markdown(proj) == (ROOT / "README.md").read_text()
    # the filter is what makes it so: the same render without it is pandoc's own markdown; HTML is left alone
    cache, pandoc = proj / "_proc", D.find_pandoc()
    plain = subprocess.run([pandoc, "index.quarto.md", "-t", "gfm"], cwd=cache, capture_output=True, check=True)
    assert plain.stdout.decode() != D.readme_markdown(proj)
    lua = str(proj / "nbs/_extensions/sao-readme/readme.lua")
    html = subprocess.run(
        [pandoc, "index.quarto.md", "-t", "html", "--lua-filter", lua], cwd=cache, capture_output=True, text=True
    )
    assert html.returncode == 0 and "Two commands" in html.stdout and "sao-repro docs --readme" not in html.stdout


def test_readme_is_short_and_everything_it_names_exists():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 170
    links = re.findall(r"\]\(([^()\s]+)\)", readme)
    local = [l for l in links if not re.match(r"[a-z]+:|#", l)]
    assert local, "the README links to the notebooks"
    for l in local:
        assert (ROOT / l.split("#")[0]).exists(), l
    targets = sorted(set(re.findall(r"(?:`|^)make ([\w-]+)", readme, flags=re.M)))
    assert {"study", "test"} <= set(targets)
    for t in targets:
        r = subprocess.run(
            ["make", "-n", t],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "VENV": str(ROOT / ".no-such-venv")},
        )
        assert r.returncode == 0, (t, r.stderr)
    from sao_repro.report.layers import layer_table

    assert layer_table(ROOT) in readme  # the layer table, generated from the tree, its links from the repository root


def _code_lines(md: str) -> list[str]:
    "The lines of the markdown's code blocks: fenced (``` or ~~~) and indented by four spaces."
    out, fence = [], None
    for line in md.splitlines():
        m = re.match(r"\s*(```|~~~)", line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is not None:
            out.append(line)
        elif line.startswith("    "):
            out.append(line[4:])
    return out


def test_readme_shows_shell_lines_as_shell_commands():
    "A notebook's `!cmd` cell is in the README as `cmd` in a bash block (the notebook still runs it), its output below."
    readme = (ROOT / "README.md").read_text()
    nb = json.loads((ROOT / D.README_NB).read_text())
    shell = [
        "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).startswith("!")
    ]
    assert shell, "the index notebook runs a command with a ! line"
    assert not [l for l in _code_lines(readme) if l.lstrip().startswith("!")]
    for src in shell:
        assert f"```bash\n{src[1:].strip()}\n```\n\n    " in readme  # the command, then its output
    assert _code_lines("```\n!x\n```\n\n    !y\n") == ["!x", "!y"]  # the check sees both kinds of block
