"""Kept samples (`sao_repro.samples`): what the testbed keeps matches the metrics of its steps, the size cap, resume."""

import gzip
import math
from dataclasses import fields

import pytest

from sao_repro.mini.runfolder import read_metrics
from sao_repro.mini.train import NonFiniteError, train_run
from sao_repro.samples import (
    SAMPLE_KNOBS,
    SAMPLES_FILE,
    SAMPLES_FULL_EVENT,
    masked_tokens,
    read_samples,
    sample_html,
    sample_text,
)

from mini_helpers import smoke_cache, smoke_cfg, strip_perf  # noqa: F401 (smoke_cache: an autouse fixture)

ROWS = 16  # smoke_cfg's trajectories_per_step: every row kept


def by_step(recs):
    out = {}
    for r in recs:
        out.setdefault(r["step"], []).append(r)
    return out


@pytest.mark.parametrize(
    "setting,kw",
    [
        ("grpo_dis", {}),
        ("single_dis", {"minibatches": 2}),
        ("single_dis", {"dis_form": "decoupled", "minibatches": 2}),
        ("grpo", {}),
    ],
)
def test_kept_samples_match_the_metrics_of_their_steps(setting, kw, tmp_path):
    "All rows of every step kept: the DIS-masked share, |logp - behav_logp|, rewards and versions are the step's metrics."
    d = train_run(
        smoke_cfg(setting, tmp_path, steps=4, samples_per_step=ROWS, samples_every=1, noise=2.0, **kw), log=None
    )
    metrics = {m["step"]: m for m in read_metrics(d)}
    steps = by_step(read_samples(d))
    assert sorted(steps) == [1, 2, 3, 4]
    n_masked_total = 0
    for step, recs in steps.items():
        m = metrics[step]
        assert [r["row"] for r in recs] == list(range(ROWS))
        gen = sum(sum(r["tokens"]["loss_mask"]) for r in recs)
        # rewards and verdicts are the step's
        rewards = [r["reward"] for r in recs]
        assert sum(rewards) / ROWS == pytest.approx(m["reward/mean"], abs=1e-9)
        assert sum(r["verdict"] == "correct" for r in recs) == m["rollout/n_correct"]
        assert sum(r["verdict"] == "truncated" for r in recs) / ROWS == pytest.approx(m["rollout/truncated_frac"])
        # every token of the batch came from version step - 1 - lag; the trainer is at step - 1
        assert {v for r in recs for v in r["tokens"]["version"]} == {step - 1 - m["rollout/policy_lag"]}
        assert {r["trainer_version"] for r in recs} == {step - 1}
        assert sum(len(r["response"]) > 0 for r in recs) == ROWS and all(r["prompt"] for r in recs)
        gaps = [
            abs(lp - b)
            for r in recs
            for lp, b, mk in zip(r["tokens"]["logp"], r["tokens"]["behav_logp"], r["tokens"]["loss_mask"])
            if mk and lp is not None and b is not None
        ]
        if setting == "grpo":
            assert all(r["tokens"]["dis_kept"] is None and r["band"] is None for r in recs)
            assert "dis/kept_frac" in m  # the metric is still logged (nothing masked)
            continue
        masked = sum(sum(masked_tokens(r)) for r in recs)
        n_masked_total += masked
        # exactly the metric's count: masked = below + above + non-finite = 1 - kept (token-weighted)
        assert masked / gen == pytest.approx(1.0 - m["dis/kept_frac"], abs=1e-12)
        want = m["dis/masked_below_frac"] + m["dis/masked_above_frac"] + m["dis/nonfinite_frac"]
        assert masked / gen == pytest.approx(want, abs=1e-12)
        assert sum(gaps) / len(gaps) == pytest.approx(m["dis/logp_abs_diff"], rel=1e-4, abs=1e-6)
        lo, hi = recs[0]["band"]
        for r in recs:  # each kept / dropped token is on its side of the band (6-decimal log-probs: a margin)
            t = r["tokens"]
            for lp, b, mk, k in zip(t["logp"], t["behav_logp"], t["loss_mask"], t["dis_kept"]):
                if mk and lp is not None and b is not None:
                    lr = lp - b
                    if math.log(lo) + 1e-5 < lr < math.log(hi) - 1e-5:
                        assert k
                    elif lr < math.log(lo) - 1e-5 or lr > math.log(hi) + 1e-5:
                        assert not k
    if setting != "grpo":
        assert n_masked_total > 0  # noise 2.0: the band drops tokens, so the check above is not vacuous


def test_samples_default_knobs_cap_and_resume(tmp_path):
    "Default knobs keep step 1 only of a short run; a small cap bounds the file with one event; a resume repeats no step."
    d = train_run(smoke_cfg("single_dis", tmp_path / "default", steps=4), log=None)
    recs = read_samples(d)
    assert [(r["step"], r["row"]) for r in recs] == [(1, 0), (1, 8)]  # samples_per_step 2, spread over 16 rows
    assert SAMPLE_KNOBS["samples_every"][0] == 10
    assert len(gzip.open(d / SAMPLES_FILE).read().splitlines()) == 2  # one plain gzip stream for any reader

    cap_mb = 0.006
    d = train_run(
        smoke_cfg(
            "single_dis", tmp_path / "cap", steps=8, samples_per_step=ROWS, samples_every=1, samples_max_mb=cap_mb
        ),
        log=None,
    )
    assert 0 < (d / SAMPLES_FILE).stat().st_size <= cap_mb * 2**20
    kept = sorted({r["step"] for r in read_samples(d)})
    assert kept and kept == list(range(1, len(kept) + 1)) and len(kept) < 8
    events = [l.split("\t")[1] for l in (d / "events.log").read_text().splitlines()]
    assert events.count(SAMPLES_FULL_EVENT) == 1

    # a run killed at step 5 (checkpoint at 3) and resumed keeps each step once, the same records as a whole run
    kw = dict(steps=6, samples_per_step=3, samples_every=1)
    full = train_run(smoke_cfg("grpo_dis", tmp_path / "a", **kw), log=None)
    crash = smoke_cfg("grpo_dis", tmp_path / "b", debug_nan_step=5, **kw)
    with pytest.raises(NonFiniteError):
        train_run(crash, log=None)
    assert max(r["step"] for r in read_samples(crash.run_dir())) == 4
    b = train_run(smoke_cfg("grpo_dis", tmp_path / "b", **kw), resume=True, log=None)
    assert [r["step"] for r in read_samples(b)] == [s for s in range(1, 7) for _ in range(3)]
    assert read_samples(b) == read_samples(full)
    assert strip_perf(read_metrics(b)) == strip_perf(read_metrics(full))  # keeping samples changes no step


def test_sample_views_escape_and_mark_masked_tokens():
    rec = {
        "step": 3,
        "row": 1,
        "prompt": "<script>alert(1)</script>",
        "prompt_ids": [1, 2],
        "reward": 0.0,
        "verdict": "wrong",
        "tokens": {
            "id": [5, 6, 7],
            "text": ["<b>", '"&', "x"],
            "logp": [-0.1, -0.1, None],
            "behav_logp": [-0.1, -3.0, -0.2],
            "version": [2, 2, 2],
            "loss_mask": [True, True, False],
            "dis_kept": [True, False, False],
        },
    }
    h = sample_html(rec)
    assert "<script>" not in h and "<b>" not in h.replace("<b>step", "") and "&lt;b&gt;" in h and "&quot;&amp;" in h
    assert h.count('class="masked"') == 1 and h.count('class="obs"') == 1
    assert '[~"&~]' in sample_text(rec) and "{x}" in sample_text(rec)


def test_sample_knob_help_is_declared_once():
    "The sample knobs' help is written once (sao_repro.samples) and both backends' options show it."
    from pathlib import Path

    pytest.importorskip("areal")
    from sao_repro.areal.config import SAOSection
    from sao_repro.mini.config import MiniRunConfig

    root = Path(__file__).resolve().parent.parent / "sao_repro"
    sources = [p.read_text() for p in root.rglob("*.py") if p.name != "_modidx.py"]
    mini = {f.name: f for f in fields(MiniRunConfig)}
    areal = {f.name: f for f in fields(SAOSection)}
    for name, (default, text) in SAMPLE_KNOBS.items():
        assert sum(s.count(text) for s in sources) == 1, name
        for f in (mini[name], areal[name]):
            assert f.metadata["help"] == text and f.default == default
    with pytest.raises(ValueError, match="samples_every"):
        MiniRunConfig(samples_every=0)
    with pytest.raises(ValueError, match="sao.samples_max_mb"):
        SAOSection(samples_max_mb=0)
