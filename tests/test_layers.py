"""The layers, declared once in pyproject.toml (import-linter's `layers` and `acyclic_siblings` contracts), hold for the
package and catch what they are there to catch; the generated module map places every module once and is current.

Layers, top first: L3 the `sao-repro` command <- L2 ops <- L1 backends and data <- L0 core. Imports inside functions
count like module-level ones (grimp reads every import statement).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sao_repro.report.layers import layer_contract, layout_markdown, module_map, package_modules

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root):
    "Run `lint-imports` on the package under `root` (its pyproject.toml): (exit code, output)."
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


@pytest.fixture
def pkg_copy(tmp_path):
    "A copy of the package's sources and pyproject.toml, to plant imports in."
    shutil.copytree(ROOT / "sao_repro", tmp_path / "sao_repro", ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def plant(root, module, line):
    p = root / "sao_repro" / (module.replace(".", "/") + ".py")
    p.write_text(p.read_text() + f"\n\ndef _planted():\n    {line}\n")


def test_the_package_keeps_its_contracts():
    rc, out = lint(ROOT)
    assert rc == 0, out
    assert "2 kept, 0 broken" in out


def test_every_import_of_the_package_names_a_module_that_exists():
    "Each `from .x import` / `from sao_repro.x import`, also those inside functions (run only when called), resolves."
    import ast
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    missing = []
    for p in sorted((root / "sao_repro").rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        pkg = list(parts[:-1]) if p.name != "__init__.py" else list(parts[:-1])
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if not isinstance(n, ast.ImportFrom):
                continue
            if n.level:
                base = pkg[: len(pkg) - (n.level - 1)]
                target = ".".join(base + ([n.module] if n.module else []))
            elif (n.module or "").split(".")[0] == "sao_repro":
                target = n.module
            else:
                continue
            if importlib.util.find_spec(target) is None:
                missing.append(f"{p.relative_to(root)}:{n.lineno} imports {target}")
    assert not missing, missing


def test_an_upward_import_in_a_function_breaks_the_layers(pkg_copy):
    rc, out = lint(pkg_copy)
    assert rc == 0, out  # the copy itself is clean
    plant(pkg_copy, "dis", "from sao_repro.report import render_report")
    rc, out = lint(pkg_copy)
    assert rc == 1
    assert "L3 CLI > L2 ops > L1 backends > L0 core BROKEN" in out
    assert "sao_repro.dis -> sao_repro.report" in out


def test_a_backend_importing_an_op_breaks_the_layers(pkg_copy):
    plant(pkg_copy, "mini.train", "import sao_repro.metrics.health")
    rc, out = lint(pkg_copy)
    assert rc == 1 and "sao_repro.mini.train -> sao_repro.metrics.health" in out


def test_a_cycle_between_siblings_breaks_the_acyclic_contract(pkg_copy):
    plant(pkg_copy, "stats", "from sao_repro.settings import list_settings")  # settings already imports core, stats ...
    plant(pkg_copy, "core", "from sao_repro.stats import fmt_ci")
    rc, out = lint(pkg_copy)
    assert rc == 1
    assert "No import cycle between sibling modules or packages BROKEN" in out


def test_a_module_in_no_layer_is_refused(pkg_copy):
    (pkg_copy / "sao_repro" / "newthing.py").write_text("x = 1\n")
    rc, out = lint(pkg_copy)
    assert rc == 1 and "sao_repro.newthing" in out
    shutil.copytree(ROOT / "nbs", pkg_copy / "nbs")
    with pytest.raises(ValueError, match="`newthing` is in no layer"):
        module_map(pkg_copy)


def test_no_top_level_module_belongs_to_a_prefix_family():
    tops = sorted({m.split(".")[0] for m in package_modules(ROOT)})
    for a in tops:
        for b in tops:
            assert a == b or not b.startswith(a + "_"), f"sao_repro.{a} and sao_repro.{b} are a prefix family"


def test_every_module_is_mapped_once_in_the_layer_of_its_top_level_name():
    rows = module_map(ROOT)
    mods = [r["module"] for r in rows]
    assert sorted(mods) == sorted(package_modules(ROOT)) and len(mods) == len(set(mods))
    layer_of = {n: label for label, names in layer_contract(ROOT) for n in names}
    assert all(r["layer"] == layer_of[r["module"].split(".")[0]] for r in rows)
    assert {r["layer"] for r in rows} == {"L0", "L1", "L2", "L3"}


def test_the_layout_page_shows_the_current_map():
    nb = json.loads((ROOT / "nbs" / "layout.ipynb").read_text())
    shown = [
        o["data"]["text/markdown"]
        for c in nb["cells"]
        if c["cell_type"] == "code"
        for o in c.get("outputs", [])
        if "text/markdown" in o.get("data", {})
    ]
    assert shown, "nbs/layout.ipynb has no saved output: execute it (jupyter nbconvert --execute --inplace)"
    text = "".join(shown[0]) if isinstance(shown[0], list) else shown[0]
    assert text == layout_markdown(ROOT), (
        "nbs/layout.ipynb is stale: run `cd nbs && jupyter nbconvert --to notebook "
        "--execute --inplace layout.ipynb && nbdev-clean`"
    )


OLD_PATHS = {  # old module -> its new home(s); the old path re-exports every name it had
    "runconfig": ["rewardconfig", "files"],
    "stopping": ["signals"],
    "reward.policy": ["reward.retry"],
    "mini.cluster": ["mini.raytasks", "mini.rayconnect"],
    "report.layout": ["report.layers"],
    "areal.trainer": ["areal.ppo_trainer", "areal.engine"],
}


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_every_old_module_path_still_imports_the_same_objects(old):
    import importlib

    if old.startswith("areal."):
        pytest.importorskip("areal")
    mod = importlib.import_module(f"sao_repro.{old}")
    new = [importlib.import_module(f"sao_repro.{m}") for m in OLD_PATHS[old]]
    names = [n for n in vars(mod) if not n.startswith("_")]
    assert set(mod.__all__) <= set(names) and len(names) >= len(mod.__all__) > 0
    for n in names:
        home = next((m for m in new if n in vars(m)), None)
        assert home is not None, f"sao_repro.{old}.{n} is in none of {OLD_PATHS[old]}"
        assert getattr(mod, n) is getattr(home, n), f"sao_repro.{old}.{n} is not {home.__name__}.{n}"


def test_the_package_imports_nothing_from_an_old_path():
    "The old paths are for code outside the package: inside it, every import names the new module."
    import ast

    old = {f"sao_repro.{m}" for m in OLD_PATHS}
    for f in sorted((ROOT / "sao_repro").rglob("*.py")):
        mod = "sao_repro." + ".".join(f.relative_to(ROOT / "sao_repro").with_suffix("").parts)
        if mod in old or f.name == "_modidx.py":
            continue
        pkg = mod.rsplit(".", 1)[0] if f.name != "__init__.py" else mod.removesuffix(".__init__")
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                targets = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            assert not old & set(targets), f"{mod} imports {old & set(targets)}"


MOVED = [  # (module, the module some of its names moved to, those names): the module still names them
    ("areal.cpu_server", "areal.cpu_generator", ["CPUGenerator", "generate", "sample_token"]),
    (
        "mini.model",
        "mini.transformer",
        ["LENGTH_BUCKETS", "ModelConfig", "Block", "Trunk", "PolicyModel", "CriticModel"],
    ),
    ("mini.model", "mini.transformer", ["token_logp", "generate", "sample_scored", "sampled_accuracy"]),
    ("report.docs", "report.mathml", ["DocsError", "MATH_RE", "CODE_RE", "SLOT_TAG", "find_pandoc", "latex_to_mathml"]),
    ("report.docs", "report.mathml", ["mathml_markdown", "mathml_nb", "fill_maths"]),
    ("report.docs", "report.readme", ["README_NB", "README_HEAD", "README_SIDE", "ReadmeText", "readme_markdown"]),
    ("report.docs", "report.readme", ["run_index", "write_readme", "readme_problems"]),
    ("mini.train", "mini.trainer", ["MiniTrainer", "NonFiniteError", "_adv_stats", "_finite", "_lam"]),
    ("areal.engine", "areal.batch_stats", ["version_stats", "logp_gap_stats", "mismatch_stats", "keep_samples"]),
    (
        "areal.engine",
        "areal.critic_init",
        ["CRITIC_INIT_ARCH", "_testbed_checkpoint", "critic_init_source", "check_critic_shapes"],
    ),
    ("report.tables", "report.quoted", ["REFERENCE_SOURCE", "REFERENCE_RESULTS", "reference_table"]),
    ("report.tables", "report.quoted", ["PAPER_ABLATION_SOURCE", "PAPER_ABLATIONS", "paper_ablation_table"]),
    ("report.tables", "report.quoted", ["ablation_table"]),
    (
        "mini.summary",
        "mini.points",
        ["EFFECT_PAIRS", "ABLATIONS", "run_windows", "summarize", "format_summary", "ablation_rows", "point_summary"],
    ),
    (
        "mini.summary",
        "mini.points",
        ["json_ready", "format_results", "format_scaled", "_verdict", "_ends", "_head", "_row"],
    ),
    (
        "mini.summary",
        "mini.phenomena",
        ["RESOLVE_MAX_SEEDS", "phenomena", "format_phenomena", "forms_side_by_side", "format_forms"],
    ),
    ("mini.summary", "mini.phenomena", ["seeds_to_resolve", "what_resolves"]),
    ("mini.summary", "mini.effects", ["KNOB_DIAGNOSTICS", "knob_effects", "format_knob_effects", "format_ablations"]),
]


@pytest.mark.parametrize("old,new,names", MOVED, ids=[f"{o}-{n}-{i}" for i, (o, n, _) in enumerate(MOVED)])
def test_names_moved_out_of_a_module_are_still_importable_from_it(old, new, names):
    import importlib

    if old.startswith("areal."):
        pytest.importorskip("areal")
    mod, home = importlib.import_module(f"sao_repro.{old}"), importlib.import_module(f"sao_repro.{new}")
    for n in names:
        assert getattr(mod, n) is getattr(home, n), f"sao_repro.{old}.{n} is not sao_repro.{new}.{n}"


MAX_MODULE_LINES, MAX_FACE_LINES = 450, 80  # a module does one job; a package's __init__.py only re-exports
MODULES = sorted(
    str(p.relative_to(ROOT / "sao_repro")) for p in (ROOT / "sao_repro").rglob("*.py") if p.name != "_modidx.py"
)


@pytest.mark.parametrize("module", MODULES)
def test_every_module_is_short_and_every_package_face_only_re_exports(module):
    "Physical lines as `wc -l` counts them: at most 450 per module, under 80 per package `__init__.py`."
    with open(ROOT / "sao_repro" / module, "rb") as f:
        n = f.read().count(b"\n")
    face = module.endswith("__init__.py")
    limit = MAX_FACE_LINES - 1 if face else MAX_MODULE_LINES
    assert n <= limit, f"sao_repro/{module}: {n} lines, over the {'face' if face else 'module'} limit of {limit}"
