"""Shared pieces of the testbed tests: a private warm-start cache, small smoke-run configs, a run folder's modes."""

import os
import re
from pathlib import Path

import pytest

from sao_repro.mini.cli import make_config


@pytest.fixture(scope="module", autouse=True)
def smoke_cache(tmp_path_factory):
    "One warm-start cache per test module (the smoke preset builds in seconds), away from the user's cache."
    old = os.environ.get("SAO_REPRO_CACHE")
    os.environ["SAO_REPRO_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("SAO_REPRO_CACHE", None)
    else:
        os.environ["SAO_REPRO_CACHE"] = old


def smoke_cfg(setting, out, **kw):
    "A seconds-long run config of `setting` writing under `out` (extra run options as keywords)."
    return make_config(
        setting,
        seed=kw.pop("seed", 0),
        steps=kw.pop("steps", 4),
        out_dir=str(out),
        smoke=False,
        overrides={
            "preset": "smoke",
            "difficulty": 1,
            "trajectories_per_step": 16,
            "n_eval": 32,
            "eval_every": 3,
            "ckpt_every": 3,
            **kw,
        },
    )


def strip_perf(ms):
    "Metrics records without the wall-clock keys (the only ones a resumed run may change)."
    return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in ms]


def modes(d) -> dict:
    "Each file's mode by its path in the run folder (TensorBoard's event files by folder: their names hold time and host)."
    d = Path(d)
    key = lambda p: re.sub(r"events\.out\.tfevents\..*$", "events.out.tfevents.*", p.relative_to(d).as_posix())
    return {key(p): p.stat().st_mode & 0o777 for p in [d, *d.rglob("*")]}
