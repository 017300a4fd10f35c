"""Times an explain page in headless Chromium: its size, load to interactive (body[data-ready]),
a zoom, a row walk-through and a head switch, and the page's JS heap. A benchmark
(bench_explain.sh runs it), not a test; it says whether the page is within the budget of
issue 12 (at most 12 MB, interactive within 1.5 s) and exits 2 when it is not.

  .venv/bin/python tests/browser/page_timing.py PAGE.html [--budget-mb 12] [--budget-ms 1500]
"""

import argparse
import json
import os
import sys
import time

from playwright.sync_api import sync_playwright

from browser_helpers import chromium_context


def milliseconds_since(start):
    return round((time.perf_counter() - start) * 1000)


def time_page(page, file, bytes_on_disk):
    timings = {"bytes": bytes_on_disk}
    start = time.perf_counter()
    page.goto("file://" + file)
    page.wait_for_selector('body[data-ready="1"]', timeout=120000, state="attached")
    interactive_ms = (time.perf_counter() - start) * 1000
    timings["interactive_ms"] = round(interactive_ms)
    timings["rows_mode"] = page.evaluate("() => document.body.dataset.rowsMode")
    # A click on the pooled overview zooms into exact cells ('exact' pages) or opens the nearest
    # sampled row ('sampled' pages, too long to hold every row).
    canvas = page.locator("#heatmap canvas")
    if canvas.count() == 1:
        box = canvas.bounding_box()
        before = page.get_attribute("#row", "data-row")
        start = time.perf_counter()
        page.mouse.click(box["x"] + box["width"] * 0.7, box["y"] + box["height"] * 0.3)
        if timings["rows_mode"] == "sampled":
            page.wait_for_function("(b) => document.querySelector('#row')?.dataset.row !== b",
                                   arg=before)
            timings["click_row_ms"] = milliseconds_since(start)
        else:
            page.wait_for_selector("#heatmap rect.cell", state="attached")
            timings["zoom_ms"] = milliseconds_since(start)
    if page.locator("#heatmap rect.cell").count() > 100:
        start = time.perf_counter()
        page.locator("#heatmap rect.cell").nth(100).click()
        page.wait_for_selector("#row-all tr[data-j]", state="attached")
        timings["row_ms"] = milliseconds_since(start)
    if page.locator("#head option").count() > 2:
        start = time.perf_counter()
        page.select_option("#head", "2")
        page.wait_for_selector('body[data-ready="1"]', state="attached")
        timings["head_switch_ms"] = milliseconds_since(start)
    heap = page.evaluate("() => (performance.memory ? performance.memory.usedJSHeapSize : -1)")
    timings["js_heap_mb"] = round(heap / 1048576)
    return timings, interactive_ms


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("page", help="the explain page (.html)")
    parser.add_argument("--budget-mb", type=float, default=12)
    parser.add_argument("--budget-ms", type=float, default=1500)
    arguments = parser.parse_args()
    file = os.path.abspath(arguments.page)
    budget_bytes = arguments.budget_mb * 1e6
    bytes_on_disk = os.path.getsize(file)
    errors = []
    with sync_playwright() as playwright, chromium_context(playwright) as context:
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(e.message))
        timings, interactive_ms = time_page(page, file, bytes_on_disk)
    within = bytes_on_disk <= budget_bytes and interactive_ms <= arguments.budget_ms
    print(json.dumps(timings, separators=(",", ":")))
    print(f"page {bytes_on_disk / 1e6:.2f} MB (budget {budget_bytes / 1e6:g} MB), interactive in "
          f"{round(interactive_ms)} ms (budget {arguments.budget_ms:g} ms): "
          + ("within budget" if within else "OVER BUDGET")
          + ("; errors: " + "; ".join(errors[:3]) if errors else ""))
    return 1 if errors else 0 if within else 2


if __name__ == "__main__":
    sys.exit(main())
