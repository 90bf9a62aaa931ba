"""Headless Chromium for the browser tests, driven by Playwright with the system Chromium (no browser download).

`open_page(width, height)` yields a Playwright page; the executable is `sao_repro.report.find_chromium()` (CHROMIUM=path,
or chromium / google-chrome on PATH). Without Chromium the `browser` tests are skipped, or fail under CI (conftest.py).
"""

import contextlib

from sao_repro.report import find_chromium

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--hide-scrollbars",
]


@contextlib.contextmanager
def open_page(width=1400, height=1500):
    "A fresh headless Chromium and one page of `width` x `height` CSS px; closed on exit."
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            yield page
        finally:
            browser.close()
