"""The system's Chromium driven by Playwright: real layout, real clicks. Playwright never fetches a browser of
its own here; it launches Debian's `chromium` (`executable_path`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Browser, sync_playwright

CHROMIUM = shutil.which("chromium")
# This machine reaches no network: no background traffic either.
QUIET = ("--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run")


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium, closed on the way out."""
    if CHROMIUM is None:
        raise RuntimeError("needs Debian's chromium on PATH")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu", *QUIET]
        )
        try:
            yield browser
        finally:
            browser.close()
