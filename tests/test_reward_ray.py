"""The `ray` backend and `sao-repro reward-workers` on a real local Ray (one session for the module)."""

import os
import signal
import time

import pytest

ray = pytest.importorskip("ray")

import reward_hooks  # noqa: E402
from reward_hooks import score_with_markers  # noqa: E402
from sao_repro.reward import RewardPool, score  # noqa: E402
from sao_repro.reward.workers import (  # noqa: E402
    ACTOR_PREFIX,
    NAMESPACE,
    list_workers,
    reward_workers_main,
    watch_once,
)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:reward workers. no Ray node")]

CHEAP = [
    (r"$\boxed{\frac{1}{2}}$", "0.5"),
    (r"$\boxed{7}$", "8"),
    (r"$\boxed{2\sqrt{2}}$", r"\sqrt{8}"),
    ("no box", "3"),
    (r"$\boxed{\{1,2\}}$", r"\{2,1\}"),
    (r"$\boxed{x=3}$", "3"),
]


@pytest.fixture(scope="module")
def ray_session():
    ray.cloudpickle.register_pickle_by_value(reward_hooks)  # Ray workers do not have tests/ on their path
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        namespace=NAMESPACE,
        log_to_driver=False,
        configure_logging=False,
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_pool(ray_session):
    with RewardPool(
        backend="ray", workers=2, timeout_s=2.0, scorer=score_with_markers, attach=False, num_cpus=0.5
    ) as p:
        assert p.wait_ready(180)
        yield p


def test_ray_pool_contract(ray_pool):
    items = CHEAP * 25
    t0 = time.monotonic()
    hang = ray_pool.submit(r"<<sao-test:hang>> \boxed{1}", "1")
    hang.add_done_callback(lambda f: setattr(f, "t_done", time.monotonic()))
    before = ray_pool.stats()
    res = ray_pool.map(items)
    assert res == [score(c, g) for c, g in items]
    assert hang.result(timeout=60) == 0.0
    assert hang.t_done - t0 <= 2.0 + 1.0
    s = ray_pool.stats()
    assert s["reward/timeouts"] - before["reward/timeouts"] == 1
    assert s["reward/done"] - before["reward/done"] == len(items) + 1
    assert s["reward/alive"] == 2 and s["reward/in_flight"] == 0


def test_ray_kill_9_verifier_and_actor_mid_batch(ray_pool):
    n = 150
    items = [(rf"<<sao-test:sleep=0.02>> \boxed{{{i}}}", str(i)) for i in range(n)]
    futs = [ray_pool.submit(c, g) for c, g in items]
    time.sleep(0.5)
    os.kill(ray_pool.worker_pids()[0], signal.SIGKILL)  # a verifier process inside an actor
    time.sleep(0.3)
    os.kill(ray_pool._impl.actor_pids()[-1], signal.SIGKILL)  # a whole actor process
    assert [f.result(timeout=180) for f in futs] == [1.0] * n
    s = ray_pool.stats()
    assert s["reward/in_flight"] == 0 and s["reward/restarts"] >= 2
    assert ray_pool.map([(r"\boxed{3}", "3")] * 8) == [1.0] * 8  # the replacement actor works


def test_cli_start_status_watch_stop(ray_session, capsys):
    assert reward_workers_main(["start", "--workers", "2", "--timeout-s", "3", "--cpus-per-worker", "0.5"]) == 0
    assert list_workers(ray_session) == [f"{ACTOR_PREFIX}0", f"{ACTOR_PREFIX}1"]
    assert reward_workers_main(["status"]) == 0
    out = capsys.readouterr().out
    assert "sao-reward-0" in out and "timeouts" in out

    # a pool in the same cluster attaches to the detached workers
    with RewardPool(backend="ray", workers=1, timeout_s=3.0) as p:
        assert p._impl.n_workers == 2 and not p._impl._owned
        assert p.map([(r"\boxed{\frac12}", "0.5"), (r"\boxed{2}", "3")]) == [1.0, 0.0]

    # kill one worker: status reports it, watch brings it back
    ray_session.kill(ray_session.get_actor(f"{ACTOR_PREFIX}1", namespace=NAMESPACE), no_restart=True)
    time.sleep(1.0)
    assert reward_workers_main(["status"]) == 1
    assert reward_workers_main(["watch", "--iterations", "1", "--interval", "0"]) == 0
    assert "restarted sao-reward-1" in capsys.readouterr().out
    assert watch_once(ray_session, {"workers": 2, "timeout_s": 3.0}) == []
    assert reward_workers_main(["status", "--json"]) == 0

    assert reward_workers_main(["stop"]) == 0
    assert list_workers(ray_session) == []
    assert reward_workers_main(["status"]) == 1
    assert reward_workers_main(["start", "--workers", "64"]) == 1  # more CPUs than the cluster has: clear error
    assert "--cpus-per-worker" in capsys.readouterr().err
    assert list_workers(ray_session) == []
