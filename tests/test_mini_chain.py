"""The chain task family (scratchpad responses, mixed difficulty), the key/value-cached decoder and the
lower-precision behaviour engine, checked against independent computations."""

import json
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from mini_helpers import smoke_cache, smoke_cfg, strip_perf  # noqa: F401  (smoke_cache: autouse fixture)
from sao_repro.data import last_boxed
from sao_repro.mini.cli import run_main
from sao_repro.mini.model import ModelConfig, PolicyModel, chain_sft_batch, generate, token_logp
from sao_repro.mini.task import (
    TaskConfig,
    chain_prompt_len,
    draw_chains,
    encode_prompts,
    eval_problems,
    max_answer_len,
    response_reward,
    sample_problems,
    scratchpad,
    task_tokenizer,
)
from sao_repro.mini.train import NonFiniteError, checkpoints, read_metrics, train_run


def left_to_right(expr: str) -> int:
    "Independent evaluator: the tokens of `a+b-c*d` applied strictly left to right."
    first, rest = re.fullmatch(r"(-?\d+)(.*)", expr).groups()  # the left value of a step may be negative
    toks, acc = re.findall(r"\d+|[+\-*]", rest), int(first)
    for op, t in zip(toks[0::2], toks[1::2]):
        acc = {"+": acc + int(t), "-": acc - int(t), "*": acc * int(t)}[op]
    return acc


CHAIN = TaskConfig(family="chain", ops="+-*", difficulty=1, min_terms=2, max_terms=5)


def test_chain_problems_schema_answers_and_split():
    tr = sample_problems(CHAIN, 400, "train", np.random.default_rng(3))
    assert tr == sample_problems(CHAIN, 400, "train", np.random.default_rng(3))  # deterministic
    for p in tr:
        assert set(p) == {"problem", "solution", "level", "type"}
        expr = re.search(r"\$([\d+\-*]+)\$ from left to right", p["problem"]).group(1)
        assert int(last_boxed(p["solution"])) == left_to_right(expr)
        assert p["level"] == f"Level {len(re.findall(r'[+*-]', expr))}"
    assert {p["level"] for p in tr} == {"Level 1", "Level 2", "Level 3", "Level 4"}  # mixed difficulty in one batch
    ev = eval_problems(CHAIN)
    assert not {p["problem"] for p in tr} & {p["problem"] for p in ev}


@settings(max_examples=40, deadline=None)
@given(
    d=st.integers(1, 3),
    lo=st.integers(2, 4),
    extra=st.integers(0, 2),
    ops=st.sampled_from(["+", "-", "+-", "+-*", "*"]),
    seed=st.integers(0, 10_000),
)
def test_scratchpad_fits_and_scores(d, lo, extra, ops, seed):
    cfg = TaskConfig(family="chain", ops=ops, difficulty=d, min_terms=lo, max_terms=lo + extra)
    rng = np.random.default_rng(seed)
    for terms, o in draw_chains(cfg, 20, "train", rng):
        assert len(scratchpad(terms, o, d)) <= max_answer_len(cfg)  # the decoder never truncates a right response
    for p in sample_problems(cfg, 10, "train", rng):
        gold = last_boxed(p["solution"])
        assert response_reward(f"1+1=2,{gold}={gold}", p, cfg) == 1.0  # the text after the last '=' is the answer
        assert response_reward(gold, p, cfg) == 1.0  # a direct answer
        assert response_reward(f"0={int(gold) + 1}", p, cfg) == 0.0
        assert response_reward(None, p, cfg) == 0.0  # truncated
    assert encode_prompts(sample_problems(cfg, 7, "heldout", rng), cfg, task_tokenizer(cfg)).shape == (
        7,
        chain_prompt_len(cfg),
    )


def test_chain_sft_rows_are_consistent():
    cfg = TaskConfig(family="chain", ops="+-", difficulty=1, max_terms=4, direct_frac=0.5)
    tok = task_tokenizer(cfg)
    tokens, mask = chain_sft_batch(cfg, tok, 200, np.random.default_rng(0), 0.0)
    P, n_direct = chain_prompt_len(cfg), 0
    for row, m in zip(tokens.tolist(), mask):
        prompt = "".join(tok.itos[i] for i in row[:P] if i > 1)
        resp = tok.decode_response(row[P:])
        assert resp is not None
        assert m.nonzero().squeeze(1).tolist() == list(range(P - 1, P + len(resp)))  # targets: response and <eos>
        truth = left_to_right(prompt.rstrip("="))
        if "=" in resp:  # the noiseless scratchpad's every step is right
            for step in resp.split(","):
                lhs, rhs = step.split("=")
                assert left_to_right(lhs) == int(rhs)
        else:
            n_direct += 1
        assert int(resp.rsplit("=", 1)[-1]) == truth
    assert 60 < n_direct < 140  # direct_frac = 0.5


@pytest.mark.parametrize("ops,slip", [("+", 10), ("-", -10)])
def test_worst_warm_start_slips_fit(ops, slip):
    "Largest operands and a slip of 10 away from zero at every step: the longest noisy scratchpad still fits."
    cfg = TaskConfig(family="chain", ops=ops, difficulty=2, min_terms=6, max_terms=6)
    terms, rs, r = [99] * 6, [], 99
    for _ in range(5):
        r = (r + 99 if ops == "+" else r - 99) + slip
        rs.append(r)
    text = scratchpad(terms, ops * 5, 2, rs)
    assert text.endswith("=644" if ops == "+" else "=-446")  # 99 + 5 x 109, 99 - 5 x 109
    assert len(text) <= max_answer_len(cfg)


def test_noisy_warm_start_rows_fit():
    "Slips of +-10 at every step still fit the row (and the model's positions)."
    cfg = TaskConfig(family="chain", ops="+", difficulty=1, min_terms=6, max_terms=6)
    tokens, mask = chain_sft_batch(cfg, task_tokenizer(cfg), 300, np.random.default_rng(1), 0.9)
    assert tokens.shape[1] == chain_prompt_len(cfg) + max_answer_len(cfg) + 1
    assert bool((tokens == task_tokenizer(cfg).eos_id).any(1).all())  # no row lost its <eos>


def test_kv_cache_decoding_matches_recompute():
    torch.manual_seed(0)
    pol = PolicyModel(ModelConfig(vocab_size=17, max_len=40))
    prompts = torch.randint(2, 17, (32, 8))
    a, la = generate(pol, prompts, 20, torch.Generator().manual_seed(5))
    b, lb = generate(pol, prompts, 20, torch.Generator().manual_seed(5), kv_cache=True)
    assert torch.equal(a, b)
    assert torch.allclose(la, lb, atol=1e-5)


def test_bfloat16_engine_mismatch_is_small_but_real():
    torch.manual_seed(0)
    pol = PolicyModel(ModelConfig(vocab_size=17, max_len=40))
    prompts = torch.randint(2, 17, (64, 8))
    out, lps = generate(pol, prompts, 10, torch.Generator().manual_seed(1), dtype="bfloat16", kv_cache=True)
    with torch.no_grad():
        lt = token_logp(pol(out), out)[:, 7:17]
    gap = (lps - lt)[lps != 0].abs()
    assert 1e-4 < float(gap.max()) < 0.5
    o32, l32 = generate(pol, prompts, 10, torch.Generator().manual_seed(1), kv_cache=True)
    with torch.no_grad():
        lt32 = token_logp(pol(o32), o32)[:, 7:17]
    assert float((l32 - lt32)[l32 != 0].abs().max()) < 1e-4  # float32 engine: no mismatch


def test_chain_run_resumes_exactly_and_logs_levels(tmp_path):
    kw = dict(
        family="chain", ops="+-", max_terms=3, behav_dtype="bfloat16", direct_frac=0.3, lag_mode="random", steps=8
    )
    full = train_run(smoke_cfg("sao", tmp_path / "a", warmup_steps=2, **kw), log=None)
    crash = smoke_cfg("sao", tmp_path / "b", warmup_steps=2, debug_nan_step=5, **kw)
    with pytest.raises(NonFiniteError):
        train_run(crash, log=None)
    train_run(smoke_cfg("sao", tmp_path / "b", warmup_steps=2, **kw), resume=True, log=None)
    a, b = read_metrics(full), read_metrics(crash.run_dir())
    assert strip_perf(a) == strip_perf(b)
    assert {"eval/acc_level1", "eval/acc_level2", "rollout/direct_frac"} <= set(a[-1])
    conf = json.loads((full / "config.json").read_text())
    assert (conf["family"], conf["behav_dtype"], conf["warm_start"]["task"]["family"]) == ("chain", "bfloat16", "chain")
    assert len(checkpoints(full)) == 2


def test_cli_chain_flags_and_errors(tmp_path, capsys):
    assert (
        run_main(
            [
                "--setting",
                "grpo",
                "--out",
                str(tmp_path),
                "--smoke",
                "--family",
                "chain",
                "--ops",
                "+-",
                "--max-terms",
                "3",
                "--behav-dtype",
                "bfloat16",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "mini/grpo/seed0/config.json").read_text())["max_terms"] == 3
    assert (
        run_main(
            [
                "--setting",
                "grpo",
                "--out",
                str(tmp_path / "x"),
                "--smoke",
                "--family",
                "chain",
                "--min-terms",
                "5",
                "--max-terms",
                "3",
            ]
        )
        == 2
    )  # a bad option: exit 2, no folder made
    assert "min_terms" in capsys.readouterr().err and not (tmp_path / "x").exists()
