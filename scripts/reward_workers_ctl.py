#!/usr/bin/env python
"""Thin wrapper: same as `sao-repro reward-workers start|stop|status|watch ...`
(see sao_repro.reward.workers.reward_workers_main)."""

import sys

from sao_repro.reward.workers import reward_workers_main

if __name__ == "__main__":
    sys.exit(reward_workers_main(sys.argv[1:]))
