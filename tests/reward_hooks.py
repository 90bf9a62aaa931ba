"""Test-only scorer for the reward pools: markers in a completion make the worker scoring it misbehave.

`<<sao-test:hang>>` sleeps forever, `<<sao-test:crash>>` kills its own process with SIGKILL,
`<<sao-test:sleep=S>>` sleeps S seconds and then scores normally, `<<sao-test:raise>>` raises inside scoring.
Tests pass it to a pool as `scorer=score_with_markers`; without it the markers are plain text."""

import os
import signal
import time

from sao_repro.reward.check import score

PREFIX = "<<sao-test:"


def score_with_markers(completion, gold) -> float:
    "Act on a test marker in `completion`, then score it as production does."
    if isinstance(completion, str) and PREFIX in completion:
        if "<<sao-test:hang>>" in completion:
            while True:
                time.sleep(3600)
        if "<<sao-test:crash>>" in completion:
            os.kill(os.getpid(), signal.SIGKILL)
        if "<<sao-test:raise>>" in completion:
            raise RuntimeError("test marker: raise")
        i = completion.find("<<sao-test:sleep=")
        if i >= 0:
            j = completion.find(">>", i)
            time.sleep(float(completion[i + len("<<sao-test:sleep=") : j]))
    return score(completion, gold)
