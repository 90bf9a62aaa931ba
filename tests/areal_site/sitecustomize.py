# Test-only: put on PYTHONPATH (tests/conftest.py does) so subprocesses such as `sao-repro areal-config`
# get the stand-ins of tests/areal_stubs.py for heavy AReaL imports that are not installed. Never shipped.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import areal_stubs

    areal_stubs.install()
except Exception:  # a broken stub must not break unrelated subprocesses
    pass
