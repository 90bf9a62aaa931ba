#!/usr/bin/env bash
# Install everything the tests need into the active Python environment (CPU only, no GPU stack).
#   python3 -m venv .venv && source .venv/bin/activate && bash scripts/install_dev.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH="${TORCH:-torch==2.13.0}"
pip install -q --upgrade pip
pip install -q $TORCH ${TORCH_ARGS:-}      # the CPU wheel first: nothing below may pull another torch
pip install -q -e '.[dev]'
# AReaL 1.0.4 for the offline CPU tests: the wheel without its ~80 dependencies (they would replace
# torch), plus exactly what its config loader, PPO actor / critic, loss and trainer modules import.
# The GPU cluster installs AReaL in full instead: scripts/bootstrap_areal.sh.
pip install -q --no-deps areal==1.0.4 hydra-core==1.4.0.dev1 torchdata==0.11.0
pip install -q "omegaconf==2.4.0" colorlog==6.12.0 uvloop==0.23.0 lark==1.3.1 httpx==0.28.1 flask==3.1.3 \
    orjson==3.13.0 einops==0.8.2 aiofiles==25.1.0 tabulate==0.10.0 pybase64==1.5.1 openai==3.57.0 \
    tensorboardX==2.6.5 aiohttp==3.14.5 pydantic==2.14.4 tenacity==9.2.1 psutil==7.2.2 requests==2.34.2 \
    pillow==13.0.0 "ray[default]==2.60.0" datasets==5.2.0
python -c "import torch; assert torch.__version__.startswith('2.13'), f'torch was replaced: {torch.__version__}'"
