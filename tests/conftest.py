"""Shared pytest setup.

AReaL 1.0.4 block (owner: AReaL backend): the offline CI installs the areal wheel with --no-deps; the few
heavy packages it imports at module top (transformers, numba, wandb, swanlab, trackio) get test-only
stand-ins, see tests/areal_stubs.py. They are served only to imports made by `areal` itself and only when
the real package is missing. Subprocesses (e.g. `sao-repro areal-config`) get them through
tests/areal_site/sitecustomize.py on PYTHONPATH.
"""
import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _TESTS)

import areal_stubs  # noqa: E402

areal_stubs.install()
_site = os.path.join(_TESTS, "areal_site")
os.environ["PYTHONPATH"] = os.pathsep.join([_site] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
