"""sao_repro.math_answer: the last `\\boxed{}` of a text, found in one pass."""

import time

from sao_repro.math_answer import last_boxed


def test_last_boxed_is_linear_in_the_text():
    def clock(n):
        text = "\\boxed{2}" + "\\boxedx" * n
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            assert last_boxed(text) == "2"
            best = min(best, time.perf_counter() - t0)
        return best

    small, big = clock(40_000), clock(80_000)  # 280 KB and 560 KB
    assert big < 3 * small + 0.01, (small, big)  # quadratic would be 4x
    assert last_boxed("x " * 600_000 + "\\boxed{7}") == "7"  # 1.2 MB solution
