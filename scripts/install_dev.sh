#!/usr/bin/env bash
# Install everything the tests and the CPU rehearsal need into the active Python environment (CPU only, no GPU stack).
#   python3 -m venv .venv && source .venv/bin/activate && bash scripts/install_dev.sh
# One line per stage; 156 s on a fresh clone here with pip's cache warm, about 3 minutes the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH="${TORCH:-torch==2.13.0}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
t0=$SECONDS
stage() { echo "install [$1/5] $2 ($((SECONDS - t0)) s so far)"; }

stage 1 "pip"
pip install -q --upgrade pip
stage 2 "$TORCH (the CPU build first: nothing below may pull another torch)"
pip install -q $TORCH ${TORCH_ARGS:-}
stage 3 "sao-repro (pandas, scipy, ...) with its dev extra (nbdev, pytest, papermill, math-verify, Ray, ...)"
pip install -q -e '.[dev]'
# What AReaL 1.0.4 imports on a CPU (config loader, PPO actor / critic, FSDP engine on gloo, trainer, stats
# loggers, checkpoint saver), pinned as AReaL pins them where it does (omegaconf 2.4.0.dev2: the final 2.4.0
# turns YAML scheduling specs into tuples of dicts). The GPU cluster installs AReaL in full: scripts/bootstrap_areal.sh.
stage 4 "AReaL's CPU dependencies (transformers, omegaconf, hydra, peft, numba, triton, loggers)"
pip install -q hydra-core==1.4.0.dev1 "omegaconf==2.4.0.dev2" torchdata==0.11.0 transformers==5.3.0 peft==0.18.1 \
    numba==0.68.1 triton==3.9.0 wandb==0.31.0 swanlab==0.10.3 trackio==0.43.0 \
    colorlog==6.12.0 uvloop==0.23.0 lark==1.3.1 httpx==0.28.1 flask==3.1.3 orjson==3.13.0 einops==0.8.2 \
    aiofiles==25.1.0 tabulate==0.10.0 pybase64==1.5.1 openai==3.57.0 tensorboardX==2.6.5 aiohttp==3.14.5 \
    pydantic==2.14.4 tenacity==9.2.1 psutil==7.2.2 requests==2.34.2 pillow==12.3.0 "ray[default]==2.60.0" datasets==5.2.0
# Last, and without its ~80 dependencies (vLLM, SGLang, agent SDKs and a CUDA torch): no later pip run then
# reports AReaL's unmet GPU-only requirements as errors. `pip check` still lists them; that is expected on a CPU.
stage 5 "areal==1.0.4 (--no-deps)"
pip install -q --no-deps areal==1.0.4
python -c "import torch; assert torch.__version__.startswith('2.13'), f'torch was replaced: {torch.__version__}'"
echo "install done in $((SECONDS - t0)) s"
