#!/usr/bin/env python3
"""Save a full-page screenshot of the dashboard with the system Chromium.

Usage (after `make demo`):
    .venv/bin/python hack/screenshot.py http://127.0.0.1:8090/ docs/images/dashboard.png
"""

from __future__ import annotations

import shutil
import sys
import time

from playwright.sync_api import sync_playwright


def main() -> int:
    url, out = sys.argv[1], sys.argv[2]
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        print("error: no chromium on PATH (bash hack/system-packages.sh)", file=sys.stderr)
        return 1
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=binary, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto(url)
        page.wait_for_selector("rect[data-job]", timeout=30000)
        time.sleep(1)
        page.screenshot(path=out, full_page=True)
        browser.close()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
