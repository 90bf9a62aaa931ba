"""Loading never runs code: every checkpoint, critic and state path of the testbed goes through
`sao_repro.safeload.load_state`, and a planted payload (a pickle that would make a folder when unpickled) never
runs, on a fresh run's `critic_init` (a file and a run folder) and on `--resume`."""

import os

import pytest
import torch

from sao_repro.mini.train import checkpoints, read_metrics, train_run
from sao_repro.runlog import read_events
from sao_repro.safeload import UnsafeStateError, load_state
from mini_helpers import smoke_cache, smoke_cfg  # noqa: F401 (smoke_cache: an autouse fixture)


class Payload:
    "Unpickling this makes the folder `marker`: the proof that code ran."

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def plant(path, marker, like=None):
    "A checkpoint-shaped file at `path` (copying `like`'s keys when given) that carries the payload."
    sd = dict(torch.load(like, weights_only=True)) if like else {"step": 1}
    sd["config"] = {**sd.get("config", {}), "evil": Payload(marker)}
    torch.save(sd, path)


def test_load_state_reads_what_the_trainer_writes(tmp_path):
    d = train_run(smoke_cfg("sao", tmp_path, steps=3), log=None)
    sd = load_state(checkpoints(d)[-1], "--resume")
    assert sd["step"] == 3 and {"policy", "opt", "critic", "history", "rng", "config"} <= set(sd)


def test_a_payload_planted_as_the_newest_checkpoint_never_runs_on_resume(tmp_path):
    marker = tmp_path / "ran"
    d = train_run(smoke_cfg("grpo", tmp_path, steps=3), log=None)
    plant(d / "checkpoints" / "step_000099.pt", marker, like=checkpoints(d)[-1])
    train_run(smoke_cfg("grpo", tmp_path, steps=4), resume=True, log=None)
    assert not marker.exists()
    assert [m["step"] for m in read_metrics(d)] == [1, 2, 3, 4]  # resumed from the real step-3 checkpoint
    assert (d / "checkpoints" / "step_000099.pt.unreadable").exists()  # set aside, kept for the user to inspect
    bad = [e for e in read_events(d) if e.get("event") == "checkpoint_unreadable"]
    assert bad and "step_000099.pt" in bad[0]["details"]["error"] and "--resume" in bad[0]["details"]["error"], bad


@pytest.mark.parametrize("as_folder", [False, True])
def test_a_payload_given_as_critic_init_is_refused_before_the_run_folder_is_made(tmp_path, as_folder):
    marker = tmp_path / "ran"
    src = train_run(smoke_cfg("sao", tmp_path / "src", steps=3), log=None)
    if as_folder:  # the last checkpoint of the run folder it names
        plant(src / "checkpoints" / "step_000099.pt", marker, like=checkpoints(src)[-1])
        init = src
    else:
        init = tmp_path / "critic.pt"
        plant(init, marker, like=checkpoints(src)[-1])
    cfg = smoke_cfg("sao", tmp_path / "new", steps=2, critic_init=str(init))
    with pytest.raises(UnsafeStateError, match=r"critic_init=.*could run code") as e:
        train_run(cfg, log=None)
    assert "os.makedirs" in str(e.value)
    assert not marker.exists()
    assert not cfg.run_dir().exists()  # nothing made for a run that cannot start


def test_a_critic_init_of_the_wrong_shape_or_no_critic_fails_before_the_run_folder(tmp_path):
    src = train_run(smoke_cfg("sao", tmp_path / "src", steps=3), log=None)
    wide = smoke_cfg("sao", tmp_path / "new", steps=2, critic_width=16, critic_init=str(src))
    with pytest.raises(ValueError, match="critic_init=.*shapes differ"):
        train_run(wide, log=None)
    assert not wide.run_dir().exists()
    torch.save({"step": 2, "critic": {"opt": {}}}, tmp_path / "nomodel.pt")
    cfg = smoke_cfg("sao", tmp_path / "new2", steps=2, critic_init=str(tmp_path / "nomodel.pt"))
    with pytest.raises(ValueError, match="critic_init=.*holds no critic weights"):
        train_run(cfg, log=None)
    assert not cfg.run_dir().exists()
