"""A fake testbed run: appends realistic metrics.jsonl / events.log lines over time.

Used by the monitor tests (and handy for trying the monitor by hand):

    python tests/fake_testbed.py --out /tmp/fake_runs --steps 200 --interval 0.5 &
    sao-repro monitor --logs /tmp/fake_runs

Each run goes to <out>/mini/<setting>/seed<S>/ with config.json, events.log and metrics.jsonl,
as the testbed writes them (see CONTRACTS.md "Run folders"). Lines are written in two halves
with a pause in between, so readers see unterminated last lines. With --nan-run, that run
logs a NaN loss at --nan-at, a `nan` event, a traceback in train.log and an `error` event,
then stops; every other run ends with a `finish` event.
"""

import argparse
import json
import math
import random
import sys
import time
from datetime import datetime
from pathlib import Path


def event(d: Path, name: str, **details):
    with open(d / "events.log", "a") as f:
        f.write(f"{datetime.now().isoformat(timespec='seconds')}\t{name}\t{json.dumps(details)}\n")


def metrics(setting: str, step: int, steps: int, rng: random.Random) -> dict:
    x = step / max(1, steps)
    acc = min(1.0, max(0.0, 0.45 + 0.2 * (1 - math.exp(-4 * x)) + rng.gauss(0, 0.03)))
    n = 64
    correct = round(acc * n)
    m = {
        "step": step,
        "acc": correct / n,
        "correct": correct,
        "incorrect": n - correct,
        "reward/mean": correct / n,
        "adv/mean": rng.gauss(0, 0.01),
        "adv/std": 1.0,
        "actor/loss": rng.gauss(-0.01, 0.005),
        "actor/grad_norm": abs(rng.gauss(0.5, 0.1)),
        "rollout/policy_lag": 3.0,
        "rollout/resp_len": 4.0 + rng.random(),
        "perf/step_s": 0.05,
    }
    if setting in ("sao", "grpo_dis", "single_dis"):
        below, above = abs(rng.gauss(0.03, 0.01)), abs(rng.gauss(0.01, 0.005))
        m |= {"dis/kept_frac": 1 - below - above, "dis/masked_below_frac": below, "dis/masked_above_frac": above}
    if setting == "sao":
        m |= {"critic/value_loss": 0.25 * math.exp(-2 * x), "critic/explained_var": 0.6 * (1 - math.exp(-3 * x))}
    lag = min(3, step - 1)  # as the testbed at --lag 3: the behaviour policy is the trainer's own at step 1 only
    m |= {
        "mismatch/lag_max": float(lag),
        "mismatch/lag_mean": float(lag),
        "mismatch/current_frac": float(lag == 0),
        "mismatch/k3_kl_all": abs(rng.gauss(0.2, 0.02)),
    }
    if lag == 0:  # k3 on tokens of the trainer's own version: logit noise 1 injects about 0.1-0.2
        m["mismatch/k3_kl"] = abs(rng.gauss(0.15, 0.02))
    if step % 10 == 0:
        m["eval/acc"] = acc
    return m


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="runs tree to write into")
    p.add_argument("--runs", default="sao:0,grpo:0", help="comma-separated setting:seed pairs")
    p.add_argument("--steps", type=int, default=40, help="steps per run")
    p.add_argument("--interval", type=float, default=0.15, help="seconds between steps")
    p.add_argument("--nan-run", default="", help="setting:seed of a run that hits a NaN and crashes")
    p.add_argument("--nan-at", type=int, default=20, help="step at which --nan-run hits the NaN")
    a = p.parse_args(argv)
    rng = random.Random(0)
    runs = {}
    for spec in a.runs.split(","):
        setting, seed = spec.split(":")
        d = Path(a.out) / "mini" / setting / f"seed{seed}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps({"setting": setting, "seed": int(seed), "backend": "mini"}))
        event(d, "start", setting=setting, seed=int(seed))
        runs[spec] = d
    alive = dict(runs)
    for step in range(1, a.steps + 1):
        for spec, d in list(alive.items()):
            m = metrics(spec.split(":")[0], step, a.steps, rng)
            if spec == a.nan_run and step == a.nan_at:
                m["actor/loss"] = float("nan")
            line = json.dumps(m) + "\n"
            with open(d / "metrics.jsonl", "a") as f:
                f.write(line[: len(line) // 2])
                f.flush()
                time.sleep(a.interval / (2 * len(alive)))
                f.write(line[len(line) // 2 :])
            if spec == a.nan_run and step == a.nan_at:
                event(d, "nan", step=step, key="actor/loss")
                (d / "train.log").write_text(
                    f"step {step} acc={m['acc']:.3f}\nTraceback (most recent call last):\n"
                    '  File "sao_repro/mini/train.py", line 1, in step\n'
                    "FloatingPointError: non-finite loss at step %d\n" % step
                )
                event(d, "error", error="FloatingPointError: non-finite loss")
                del alive[spec]
        time.sleep(a.interval / 2)
    for d in alive.values():
        event(d, "finish", steps=a.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
