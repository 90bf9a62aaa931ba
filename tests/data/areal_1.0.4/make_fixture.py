"""Regenerate main.log / merged.log with AReaL 1.0.4's own code (not run by the tests; the logs are committed).

    pip download areal==1.0.4 --no-deps -d /tmp/areal_whl_mon
    unzip -q /tmp/areal_whl_mon/areal-1.0.4-py3-none-any.whl -d /tmp/areal_whl_mon/src
    pip install --target /tmp/areal_whl_mon/deps tabulate colorlog
    python make_fixture.py /tmp/out && cp /tmp/out/*.log .

It loads areal/utils/logging.py and areal/utils/printing.py from the wheel by file path and replays what
StatsLogger.commit logs for 3 steps (step 3 has a NaN actor loss), then "Training completes!".
"""

import importlib.util
import sys
import shutil

sys.path.insert(0, "/tmp/areal_whl_mon/deps")


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


src = "/tmp/areal_whl_mon/src/areal/utils"
alog = load("areal_logging", f"{src}/logging.py")
apr = load("areal_printing", f"{src}/printing.py")
out = sys.argv[1]
shutil.rmtree(out, ignore_errors=True)
alog.setup_file_logging(out)
logger = alog.getLogger("StatsLogger", "system")
total = 3
for gs in range(total):
    c = 20 + 5 * gs
    item = {
        "ppo_actor/correct_n_seqs": float(c),
        "ppo_actor/incorrect_n_seqs": float(64 - c),
        "ppo_actor/n_seqs": 64.0,
        "ppo_actor/task_reward/avg": c / 64,
        "ppo_actor/task_reward/min": 0.0,
        "ppo_actor/task_reward/max": 1.0,
        "ppo_actor/advantages/avg": 0.01 * gs,
        "ppo_actor/seq_len/avg": 300.0 + gs,
        "ppo_actor/prompt_len/avg": 100.0,
        "ppo_actor/update/actor_loss/avg": -0.02 if gs != 2 else float("nan"),
        "ppo_actor/update/grad_norm": 0.5 + gs,
        "ppo_actor/update/clip_ratio/avg": 0.001,
        "ppo_actor/update/rs_filtered_fraction": 0.05,
        "ppo_actor/update/version_stats/sample_staleness_theta_avg": 1.5,
        "ppo_critic/update/critic_loss/avg": 0.2,
        "rollout/reward": c / 64,
        "timeperf/train_step": 12.5,
        "ppo_actor/update/grad_norm__count": 1,
    }
    logger.info(f"Epoch 1/1 Step {gs + 1}/{total} Train step {gs + 1}/{total} done.")
    item = {k: v for k, v in item.items() if not k.endswith("__count")}
    logger.info("Stats (1/1):")
    logger.info("\n" + apr.tabulate_stats(item))
logger.info("Training completes! Total time elapsed 42.00.")
