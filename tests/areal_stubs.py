"""Stand-ins for the heavy packages AReaL 1.0.4 imports at module top (see sao_repro.areal.standins).

The tests install `areal==1.0.4` with `--no-deps` (scripts/install_dev.sh); `install()` serves stand-ins
for transformers / numba / wandb / swanlab / trackio, only to AReaL's own imports and only when the real
package is missing. tests/conftest.py calls it; subprocesses get it through tests/areal_site/sitecustomize.py.
"""
from sao_repro.areal.standins import STUBS, STUBS_ACTIVE, active, areal_available, install  # noqa: F401
