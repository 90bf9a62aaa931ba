"Worker for the two-rank gloo test of RunningMeanRewardNorm (a light module: spawned children import only this)."

import torch
import torch.distributed as dist

from sao_repro.areal.algo import RunningMeanRewardNorm


def rank_worker(rank, world, init_file, out_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    res = {}
    for mode in ("exact", "ema"):
        # "ema" also checks the lazily resolved group (how SAOPPOActor passes the engine's data-parallel group)
        norm = RunningMeanRewardNorm(mode=mode, group=(lambda: dist.group.WORLD) if mode == "ema" else None)
        batches = {0: [[1.0, 1.0, 1.0], [0.0]], 1: [[0.0], [1.0, 1.0]]}[rank]
        res[mode] = {"outs": [norm(torch.tensor(b)).tolist() for b in batches], "state": norm.state_dict()}
    torch.save(res, f"{out_file}.{rank}")
    dist.destroy_process_group()
