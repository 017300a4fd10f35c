"""The explain page in a real browser: Debian's headless Chromium driven by PyPI's playwright.

  .venv/bin/python tests/browser/explain_page_test.py --qkv build/qkv --work DIR
      [--screenshots docs] [--only NAME,..]

Pages: the built-in example; Q, K, V files (two query heads on one kv head, causal + a bool
mask), also opened at --head 1 (and --row 17); a row with no allowed key; a sink; a batched
input (also opened at --batch 1 --row 7); cross-attention (layer form with --memory); the
layer form with --wqkv, --bqkv and --linear-layout against `qkv layer`; n = 1024 with a window
(pooled, zoomed); n = 2048 with a float mask (sampled rows); n = 4096 random and causal.
Expected numbers come from outside the page: the built-in example worked out here in float64
(builtin_example.py), or `qkv attention --kernel reference --weights --out-dtype f64`.
Tolerance 1e-6 on weights: explain and `qkv attention` without --kernel compute in float32
(fused_hwy, for float64 files too), which agrees with the float64 reference kernel within
~2e-7 on these inputs; the built-in example runs the reference kernel (~1e-16). 1e-6 is far
below any mistake (a wrong key, scale or mask moves a weight by > 1e-3).
--screenshots DIR writes explain.png (built-in, 1400 px), explain-mobile.png (360 px) and
explain-large.png (n = 4096 causal) for the README; the default run (ctest) writes none.
"""

import argparse
import os
import re
import shutil
import sys
import tempfile

import numpy as np
from playwright.sync_api import sync_playwright

from browser_helpers import (canvas_cell_luminances, canvas_cell_pixel, canvas_stats, check,
                             chromium_context, compare_row, colour_distance, decode_png,
                             drawn_share, failure_count, format_exp, gap, hex_colour,
                             random_values, read_npy_f64, row_weights, runner, squash,
                             text_or_empty, with_page, write_npy)
from page_checks import (builtin_checks, expect_masked_cell_colour, expect_same_sentences,
                         expect_terminal_entropy, headers_fit, masked_colour, no_overflow)

TOLERANCE = 1e-6
# The n = 4096 overview is "not blank" when the luminance of its drawn cells has a standard
# deviation of at least 10 levels of 255 (variance >= 100): a canvas of one colour has 0, and
# a colour scale whose cells differ by less than 4% of the range reads as a flat square.
MIN_VARIANCE = 100


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--qkv", default="build/qkv", help="the qkv executable")
    parser.add_argument("--work", default=None, help="a folder for the inputs and pages (emptied)")
    parser.add_argument("--screenshots", default=None, help="write the README's pictures here")
    parser.add_argument("--only", default=None, help="comma-separated groups: builtin, masked, "
                        "head, batched, cross, parity, pooled, sampled, large")
    return parser.parse_args()


class Inputs:
    """The pages, the flags that made them, and the reference weights and outputs, all written
    by `qkv` into the work folder before the browser starts."""

    def __init__(self, run, work):
        self.run = run
        self.work = work

    def at(self, name):
        return os.path.join(self.work, name)

    def make(self):
        run, at = self.run, self.at
        # The built-in example.
        self.builtin = at("builtin.html")
        run(["explain", "--html", self.builtin])
        # Q, K, V files: two query heads sharing one kv head, causal, and a bool mask.
        self.h, self.nq, self.nk, d, dv = 2, 40, 48, 16, 8
        h, nq, nk = self.h, self.nq, self.nk
        write_npy(at("q.npy"), [h, nq, d], random_values(h * nq * d, 1, 2))
        write_npy(at("k.npy"), [1, nk, d], random_values(nk * d, 2, 2))
        write_npy(at("v.npy"), [1, nk, dv], random_values(nk * dv, 3))
        write_npy(at("mask.npy"), [nq, nk], random_values(nq * nk, 4) > -0.6, bool)
        self.files = ["--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--causal",
                      "--mask", "mask.npy"]
        self.masked = at("masked.html")
        run(["explain", *self.files, "--html", self.masked])
        run(["explain", *self.files, "--quiet", "--svg", at("masked.svg")])
        self.head1 = at("head1.html")
        run(["explain", *self.files, "--head", "1", "--html", self.head1])
        self.head1row = at("head1row.html")
        run(["explain", *self.files, "--quiet", "--head", "1", "--row", "17",
             "--html", self.head1row])
        run(["attention", *self.files, "--kernel", "reference", "--out-dtype", "f64",
             "--out", "o.npy", "--weights", "w.npy"])
        self.reference = read_npy_f64(at("w.npy"))
        # A row with no allowed key (row 2 of a bool mask): the page says what the terminal says.
        write_npy(at("q4.npy"), [6, 4], random_values(24, 31))
        write_npy(at("k4.npy"), [6, 4], random_values(24, 32))
        write_npy(at("v4.npy"), [6, 3], random_values(18, 33))
        write_npy(at("mask4.npy"), [6, 6], [e // 6 != 2 for e in range(36)], bool)
        self.no_key_files = ["--q", "q4.npy", "--k", "k4.npy", "--v", "v4.npy",
                             "--mask", "mask4.npy"]
        self.no_key = at("nokey.html")
        run(["explain", *self.no_key_files, "--html", self.no_key])
        # A sink (a logit of 1 with no value) on a causal input of 8: row 0 has one key.
        write_npy(at("q5.npy"), [8, 4], random_values(32, 41))
        write_npy(at("k5.npy"), [8, 4], random_values(32, 42))
        write_npy(at("v5.npy"), [8, 3], random_values(24, 43))
        write_npy(at("s5.npy"), [1], [1.0])
        self.sink_files = ["--q", "q5.npy", "--k", "k5.npy", "--v", "v5.npy", "--causal",
                           "--sinks", "s5.npy"]
        self.sink = at("sink.html")
        run(["explain", *self.sink_files, "--html", self.sink])
        # A batch of 2 elements, 1 head, n = 12, causal.
        write_npy(at("qb.npy"), [2, 1, 12, 4], random_values(96, 11, 2))
        write_npy(at("kb.npy"), [2, 1, 12, 4], random_values(96, 12, 2))
        write_npy(at("vb.npy"), [2, 1, 12, 3], random_values(72, 13))
        batch_files = ["--q", "qb.npy", "--k", "kb.npy", "--v", "vb.npy", "--causal"]
        self.batched = at("batched.html")
        run(["explain", *batch_files, "--html", self.batched])
        self.batched1 = at("batched1.html")
        run(["explain", *batch_files, "--quiet", "--batch", "1", "--row", "7",
             "--html", self.batched1])
        run(["attention", *batch_files, "--kernel", "reference", "--out-dtype", "f64",
             "--out", "ob.npy", "--weights", "wb.npy"])
        self.reference_b = read_npy_f64(at("wb.npy"))
        # Cross-attention, layer form: X [5, 6] against a memory [9, 6].
        write_npy(at("x.npy"), [5, 6], random_values(30, 21))
        write_npy(at("m.npy"), [9, 6], random_values(54, 22))
        for name, seed in [("wq", 23), ("wk", 24), ("wv", 25)]:
            write_npy(at(name + ".npy"), [6, 4], random_values(24, seed))
        self.cross = at("cross.html")
        run(["explain", "--x", "x.npy", "--memory", "m.npy", "--wq", "wq.npy", "--wk", "wk.npy",
             "--wv", "wv.npy", "--heads", "2", "--html", self.cross])
        # Parity with `qkv layer`: a fused W^Q|W^K|W^V stored [out, in] (--linear-layout) with its
        # fused bias, 2 heads of d_k = 3, causal; the page's O_i (its stacked sum's data-value
        # segments, added up) against the layer's --out in float64.
        write_npy(at("xp.npy"), [6, 8], random_values(48, 61))
        write_npy(at("wqkvT.npy"), [18, 8], random_values(144, 62))
        write_npy(at("bqkv.npy"), [18], random_values(18, 63))
        parity_flags = ["--x", "xp.npy", "--wqkv", "wqkvT.npy", "--bqkv", "bqkv.npy",
                        "--linear-layout", "--heads", "2", "--causal"]
        self.parity = at("parity.html")
        run(["explain", "--quiet", *parity_flags, "--html", self.parity])
        run(["layer", *parity_flags, "--out-dtype", "f64", "--out", "ol.npy"])
        self.layer_out = read_npy_f64(at("ol.npy"))
        # n = 1024 with a window: the overview is pooled, a click zooms into exact cells.
        self.n = n = 1024
        write_npy(at("q2.npy"), [n, d], random_values(n * d, 5, 2))
        write_npy(at("k2.npy"), [n, d], random_values(n * d, 6, 2))
        write_npy(at("v2.npy"), [n, dv], random_values(n * dv, 7))
        long_files = ["--q", "q2.npy", "--k", "k2.npy", "--v", "v2.npy", "--window", "200,0"]
        self.pooled = at("pooled.html")
        run(["explain", *long_files, "--html", self.pooled])
        run(["attention", *long_files, "--kernel", "reference", "--out-dtype", "f64",
             "--out", "o2.npy", "--weights", "w2.npy"])
        self.reference_2 = read_npy_f64(at("w2.npy"))
        # n = 2048 with a float mask (a third of it -inf): too large to embed, so the page holds
        # sampled rows; each must still equal the reference.
        self.ns = ns = 2048
        write_npy(at("qs.npy"), [ns, d], random_values(ns * d, 51, 2))
        write_npy(at("ks.npy"), [ns, d], random_values(ns * d, 52, 2))
        write_npy(at("vs.npy"), [ns, dv], random_values(ns * dv, 53))
        coin = random_values(ns * ns, 55)
        write_npy(at("fmask.npy"), [ns, ns],
                  np.where(coin < -0.33, -np.inf, random_values(ns * ns, 54)))
        self.sampled_files = ["--q", "qs.npy", "--k", "ks.npy", "--v", "vs.npy",
                              "--mask", "fmask.npy"]
        self.sampled = at("sampled.html")
        run(["explain", "--quiet", *self.sampled_files, "--html", self.sampled])
        run(["attention", *self.sampled_files, "--kernel", "reference", "--out-dtype", "f64",
             "--out", "os.npy", "--weights", "ws.npy"])
        self.reference_s = read_npy_f64(at("ws.npy"))
        # n = 4096: random, and causal.
        big = 4096
        write_npy(at("q3.npy"), [big, d], random_values(big * d, 8, 2))
        write_npy(at("k3.npy"), [big, d], random_values(big * d, 9, 2))
        write_npy(at("v3.npy"), [big, dv], random_values(big * dv, 10))
        big_files = ["--q", "q3.npy", "--k", "k3.npy", "--v", "v3.npy"]
        self.large = at("large.html")
        self.large_causal = at("large-causal.html")
        run(["explain", *big_files, "--html", self.large])
        run(["explain", *big_files, "--causal", "--html", self.large_causal])
        return self


def check_builtin(context, inputs):
    def body(page):
        builtin_checks(page, inputs.run, TOLERANCE)
        no_overflow(page, "built-in")
        _, _, pixels = decode_png(page, page.screenshot(full_page=True))
        share = drawn_share(pixels)
        check(share > 0.02,
              f"built-in: the screenshot is not blank ({100 * share:.1f}% of pixels drawn)")
    with_page(context, inputs.builtin, body)


def check_masked(context, inputs):
    nq, nk, run, files = inputs.nq, inputs.nk, inputs.run, inputs.files

    def masked(page):
        check(page.locator("#heatmap rect.cell").count() == nq * nk,
              "masked: the heatmap has 40 x 48 cells")
        check(page.locator("#summary tr.head-row").count() == inputs.h,
              "masked: one summary row per head")
        check(page.locator("#mask-legend").count() == 1,
              "masked: the mask has a legend (#mask-legend)")
        # Causal with 8 more keys than queries: (0, 47) is masked whatever the bool mask says.
        check(page.locator('#heatmap rect.cell.masked[data-i="0"][data-j="47"]').count() == 1,
              "masked: cell (0, 47) is drawn as masked")
        expect_masked_cell_colour(page, "masked")
        # The --svg export of head 0 draws the same cells masked, in the same colour: as many
        # masked cells as the reference has forbidden (weight 0) pairs, each filled with it.
        colour = masked_colour(page)
        with open(inputs.at("masked.svg"), encoding="utf-8") as svg:
            masked_rects = re.findall(r'<rect class="cell masked"[^>]*>', svg.read())
        forbidden = int(np.count_nonzero(inputs.reference[: nq * nk] == 0))
        check(len(masked_rects) == forbidden and all(f'fill="{colour}"' in r for r in masked_rects),
              f"masked: the --svg export has {forbidden} masked cells in {colour} "
              f"({len(masked_rects)})")
        worst, why = 0.0, ""
        for head, row in [(0, 0), (0, 17), (1, 5), (1, 39)]:
            page.select_option("#head", str(head))
            page.click(f'#heatmap rect.cell[data-i="{row}"][data-j="0"]')
            check(page.get_attribute("#row", "data-row") == str(row) and
                  page.get_attribute("#row", "data-head") == str(head),
                  f"masked: clicking ({row}, 0) of head {head} opens that row")
            want = inputs.reference[(head * nq + row) * nk:(head * nq + row + 1) * nk]
            row_worst, row_why = compare_row(row_weights(page), want, TOLERANCE)
            if row_worst > worst:
                worst, why = row_worst, row_why
        check(worst <= TOLERANCE, "masked: clicked rows list the allowed keys with the reference "
              f"weights (max diff {format_exp(worst)}) {why}")
        page.select_option("#head", "0")
        page.click('#heatmap rect.cell[data-i="17"][data-j="0"]')
        expect_terminal_entropy(page, run, files + ["--head", "0"], 17, "masked")
        no_overflow(page, "masked (40 x 48 exact cells)")

    def no_key(page):
        page.click('#heatmap rect.cell[data-i="2"][data-j="0"]')
        check(page.locator("#row-all tr[data-j]").count() == 0, "no-key row: no key is listed")
        expect_terminal_entropy(page, run, inputs.no_key_files, 2, "no-key row")

    def sink(page):
        for row in [0, 3]:
            page.click(f'#heatmap rect.cell[data-i="{row}"][data-j="0"]')
            expect_same_sentences(page, run, inputs.sink_files, row, f"sink, row {row}")
            # exp(H) <= A for any distribution over A keys (2 decimals printed).
            m = re.search(r"exp\(entropy\) = ([\d.]+) of (\d+) allowed",
                          text_or_empty(page, "#row .entropy"))
            check(m is not None and float(m.group(1)) <= float(m.group(2)) + 0.005,
                  f"sink, row {row}: no more effective keys than allowed ones "
                  f"({m.group(0) if m else 'no entropy line'})")

    with_page(context, inputs.masked, masked)
    with_page(context, inputs.no_key, no_key)
    with_page(context, inputs.sink, sink)


def check_head(context, inputs):
    def head1(page):
        check(page.input_value("#head") == "1", "--head 1: the page opens head 1")
        check(page.get_attribute("#row", "data-head") == "1",
              "--head 1: the open walk-through is of head 1")
        row = page.get_attribute("#row", "data-row")
        check(page.locator(".row-highlight").count() >= 1 and
              page.get_attribute("#heatmap", "data-row") == row,
              f"--head 1: the open row {row} is highlighted (.row-highlight, #heatmap[data-row])")

    def head1row(page):
        check(page.input_value("#head") == "1" and
              page.get_attribute("#row", "data-head") == "1" and
              page.get_attribute("#row", "data-row") == "17" and
              page.get_attribute("#heatmap", "data-row") == "17",
              "--head 1 --row 17: the page opens row 17 of head 1, highlighted")

    with_page(context, inputs.head1, head1)
    with_page(context, inputs.head1row, head1row)


def check_batched(context, inputs):
    want = inputs.reference_b[(12 + 7) * 12:(12 + 8) * 12]

    def batched1(page):
        check(page.input_value("#batch") == "1" and page.get_attribute("#row", "data-row") == "7",
              "--batch 1 --row 7: the page opens row 7 of batch element 1")
        worst, why = compare_row(row_weights(page), want, TOLERANCE)
        check(worst <= TOLERANCE, "--batch 1 --row 7: the open row equals the reference " + why)

    def batched(page):
        check(page.locator("#batch").is_visible() and page.locator("#batch option").count() == 2,
              "batched: #batch offers the 2 batch elements")
        page.select_option("#batch", "1")
        page.click('#heatmap rect.cell[data-i="7"][data-j="0"]')
        worst, why = compare_row(row_weights(page), want, TOLERANCE)
        check(worst <= TOLERANCE, "batched: row 7 of batch element 1 equals the reference " + why)

    with_page(context, inputs.batched1, batched1)
    with_page(context, inputs.batched, batched)


def check_cross(context, inputs):
    def cross(page):
        check(not re.search("distance", page.text_content("#summary"), re.IGNORECASE),
              "cross-attention: no distance column in #summary")
        check(not re.search("distance", text_or_empty(page, "#row"), re.IGNORECASE),
              "cross-attention: the walk-through reports no distance")
    with_page(context, inputs.cross, cross)


def check_parity(context, inputs):
    def parity(page):
        worst, rows = 0.0, 0
        for head in [0, 1]:
            page.select_option("#head", str(head))
            for i in range(6):
                page.click(f'#heatmap rect.cell[data-i="{i}"][data-j="0"]')
                o = page.eval_on_selector_all(
                    "#stacked-sum g.term rect[data-c][data-value]", """(rs) => {
                    const sum = [0, 0, 0];
                    for (const r of rs) sum[Number(r.dataset.c)] += Number(r.dataset.value);
                    return sum;
                  }""")
                for c in range(3):
                    worst = max(worst, gap(o[c], inputs.layer_out[i * 6 + head * 3 + c]))
                rows += 1
        check(rows == 12 and worst <= TOLERANCE,
              "parity: the page's O_i (--wqkv, --bqkv, --linear-layout, "
              f"2 heads) equal qkv layer's --out (max diff {format_exp(worst)})")
    with_page(context, inputs.parity, parity)


def check_pooled(context, inputs):
    def pooled(page):
        # The keyboard works on the pooled map too: Enter opens the cursor's row.
        page.focus("#heatmap")
        for _ in range(3):
            page.keyboard.press("ArrowDown")
        page.keyboard.press("ArrowRight")
        cursor = str(page.get_attribute("#heatmap", "data-cursor"))
        page.keyboard.press("Enter")
        check(re.fullmatch(r"\d+,\d+", cursor) is not None and
              page.get_attribute("#row", "data-row") == cursor.split(",")[0] and
              len(squash(page.text_content("#heatmap-status"))) > 0,
              f"pooled: arrows then Enter open the cursor's row (cursor {cursor}) and the status "
              "names the block")
        canvas = page.locator("#heatmap canvas")
        check(canvas.count() == 1 and canvas.get_attribute("data-rows") == "512" and
              canvas.get_attribute("data-cols") == "512",
              "pooled: the overview is 512 x 512 pooled cells")
        box = canvas.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
        check(page.locator("#heatmap rect.cell").count() == 64 * 64,
              "pooled: a click zooms into 64 x 64 exact cells")
        first = page.locator("#heatmap rect.cell").first
        row = int(first.get_attribute("data-i"))
        first.click()
        n = inputs.n
        want = inputs.reference_2[row * n:(row + 1) * n]
        worst, why = compare_row(row_weights(page), want, TOLERANCE)
        check(worst <= TOLERANCE, f"pooled: the zoomed row {row} equals the reference {why}")
    with_page(context, inputs.pooled, pooled)


def check_sampled(context, inputs):
    ns = inputs.ns

    def sampled(page):
        check(page.evaluate("() => document.body.dataset.rowsMode") == "sampled",
              "sampled: a 2048 x 2048 float mask makes a sampled page")
        box = page.locator("#heatmap canvas").bounding_box()
        worst, why = 0.0, ""
        opened = {}  # the rows opened, in the order first opened
        for fx, fy in [(0.2, 0.1), (0.5, 0.5), (0.8, 0.93)]:
            page.mouse.click(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy)
            page.wait_for_timeout(100)
            row = int(page.get_attribute("#row", "data-row"))
            opened[row] = True
            # A sampled row lists its heaviest keys and says how many of how many allowed.
            want = inputs.reference_s[row * ns:(row + 1) * ns]
            listed = row_weights(page)
            row_worst, row_why = compare_row(listed, want, TOLERANCE, top=True)
            if row_worst > worst:
                worst, why = row_worst, f"row {row}: {row_why}"
            allowed = int(np.count_nonzero(want > 0))
            summary = squash(text_or_empty(page, "#row-all-details summary"))
            if str(len(listed)) not in summary or str(allowed) not in summary:
                worst = float("inf")
                why = f'row {row}: the list is headed "{summary}", not {len(listed)} of {allowed}'
        check(len(opened) == 3 and worst <= TOLERANCE, "sampled: the rows opened from the map "
              f"({','.join(map(str, opened))}) list their heaviest keys with the reference weights "
              + ("" if worst <= TOLERANCE else why))
        expect_same_sentences(page, inputs.run, inputs.sampled_files, list(opened)[-1], "sampled")
    with_page(context, inputs.sampled, sampled)


def check_large(context, inputs):
    for file, label, causal in [(inputs.large, "n = 4096 random", False),
                                (inputs.large_causal, "n = 4096 causal", True)]:
        def large(page, label=label, causal=causal):
            def variance(what):
                # Cell centres only, and for causal only cells wholly below the diagonal: the
                # masked half alone would make a blank map look varied.
                values = np.asarray(canvas_cell_luminances(page, "#heatmap canvas", 3, causal))
                v = float(np.mean((values - values.mean()) ** 2))
                check(v >= MIN_VARIANCE, f"{label}, {what}: the overview is not blank "
                      f"(luminance variance {v:.0f} >= {MIN_VARIANCE})")
                return v

            check(page.input_value("#scale") == "row", label + ": the default scale is per row")
            variance("scale per row")
            # The global scale: meaningful for causal, where row 0 has one key (weight 1) and the
            # last row 4096 (weights ~1/4096), so the map must show that gradient in log colour.
            # For random inputs every row's weights are near 1/4096 and a global map is rightly
            # near-uniform: its variance is printed, not checked.
            page.select_option("#scale", "global")
            page.select_option("#colour", "log")
            if causal:
                variance("global scale, log colour")
            else:
                stats = canvas_stats(page, "#heatmap canvas")
                print(f"info  {label}, global scale, log colour: luminance variance "
                      f"{stats['variance']:.0f}")
            page.select_option("#colour", "linear")
            stats = canvas_stats(page, "#heatmap canvas")
            print(f"info  {label}, global scale, linear colour: luminance variance "
                  f"{stats['variance']:.0f}")
            page.select_option("#scale", "row")
            if not causal:
                return
            want = hex_colour(masked_colour(page))
            pixel = canvas_cell_pixel(page, "#heatmap canvas", 0, 511)
            check(want is not None and colour_distance(pixel, want) <= 1,
                  f"{label}: the fully masked pooled cell (0, 511) has the masked colour "
                  f"({pixel} vs {want})")
            # Mean pooling: a different map, still not blank, masked blocks still masked.
            max_map = canvas_cell_luminances(page, "#heatmap canvas", 16, False)
            page.select_option("#pooling", "mean")
            mean_map = canvas_cell_luminances(page, "#heatmap canvas", 16, False)
            check(len(mean_map) == len(max_map) and
                  any(abs(y - x) > 1 for y, x in zip(mean_map, max_map)),
                  label + ": mean pooling draws another map than max pooling")
            variance("mean pooling")
            mean_pixel = canvas_cell_pixel(page, "#heatmap canvas", 0, 511)
            check(want is not None and colour_distance(mean_pixel, want) <= 1,
                  label + ", mean pooling: cell (0, 511) has the masked colour")
            page.select_option("#pooling", "max")
            no_overflow(page, label)
            # Zoomed into the top right (all masked): the exact cells have the same colour.
            box = page.locator("#heatmap canvas").bounding_box()
            page.mouse.click(box["x"] + box["width"] * 0.97, box["y"] + box["height"] * 0.03)
            expect_masked_cell_colour(page, label + ", zoomed")
        with_page(context, file, large)


def check_headers(context, inputs):
    """The Heads table's headers on one line from 360 to 2560 px, screenshots of it at each
    width in WORK/headers (page_checks.headers_fit)."""
    shots = os.path.join(inputs.work, "headers")
    os.makedirs(shots, exist_ok=True)
    for file, label in [(inputs.builtin, "built-in"), (inputs.masked, "masked"),
                        (inputs.large_causal, "large-causal")]:
        with_page(context, file, lambda page, label=label: headers_fit(page, label, shots))


def take_screenshots(context, inputs, folder):
    os.makedirs(folder, exist_ok=True)
    for file, name, width, height in [(inputs.builtin, "explain.png", 1400, 900),
                                      (inputs.builtin, "explain-mobile.png", 360, 780),
                                      (inputs.large_causal, "explain-large.png", 1400, 900)]:
        def shoot(page, name=name, width=width):
            # The built-in page at 1400 px: its top 1600 px (the story, the map and the open row).
            clip = ({"x": 0, "y": 0, "width": width, "height": 1600}
                    if name == "explain.png" else None)
            page.screenshot(path=os.path.join(folder, name), full_page=clip is not None, clip=clip)
            print("wrote " + os.path.join(folder, name))
        with_page(context, file, shoot, {"width": width, "height": height})


PAGE_GROUPS = [("builtin", check_builtin), ("masked", check_masked), ("head", check_head),
               ("batched", check_batched), ("cross", check_cross), ("parity", check_parity),
               ("pooled", check_pooled), ("sampled", check_sampled), ("large", check_large),
               ("headers", check_headers)]


def main():
    arguments = parse_arguments()
    qkv = os.path.abspath(arguments.qkv)
    work = os.path.abspath(arguments.work or tempfile.mkdtemp(prefix="qkv-browser-"))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    wanted = arguments.only.split(",") if arguments.only else [name for name, _ in PAGE_GROUPS]
    inputs = Inputs(runner(qkv, work), work).make()
    with sync_playwright() as playwright, chromium_context(playwright) as context:
        for name, check_group in PAGE_GROUPS:
            if name in wanted:
                check_group(context, inputs)
        if arguments.screenshots:
            take_screenshots(context, inputs, arguments.screenshots)
    failures = failure_count()
    print(f"{failures} check(s) failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
