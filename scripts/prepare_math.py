#!/usr/bin/env python
"""Thin wrapper: same as `sao-repro prepare-math ...` (see sao_repro.data.prepare_math_main)."""

import sys

from sao_repro.data import prepare_math_main

if __name__ == "__main__":
    sys.exit(prepare_math_main(sys.argv[1:]))
