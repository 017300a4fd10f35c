"""Checks of the explain page that several pages share (the terminal's sentences, no overflow,
the masked colour), and the built-in example's checks against builtin_example.py."""

import os
import re

from browser_helpers import (check, colour_distance, compare_row, format_exp, gap, hex_colour,
                             pixel_at_centre, row_weights, squash, text_or_empty)
from builtin_example import FILMS, GENRES, GIVES, USERS, builtin_attention

WIDTHS = [360, 768, 1400]
_SENTENCE_LINE = re.compile(r"^\(|^4\. weights|^6\. O_|^7\. |no key is allowed")


def terminal_sentences(run, args, row):
    """The terminal's sentences for one row that the page must say word for word: the
    parenthesised notes, step 4's heading, step 6's sum (before its values), line 7 and the
    no-key lines; step numbers ("4. ") dropped. The first walk-through of the output is used."""
    lines = run(["explain", *args, "--row", str(row)]).split("\n")
    start = next((n for n, line in enumerate(lines) if line.startswith("── query ")), -1)
    end = next((n for n, line in enumerate(lines)
                if n > start and (line.startswith("── query ") or line.strip() == "")), None)
    sentences = []
    for line in lines[start + 1:end]:
        line = line.strip()
        if _SENTENCE_LINE.search(line):
            line = re.sub(r"^\d\. ", "", line)
            line = re.sub(r" = \[.*\]$", "", line)
            sentences.append(re.sub(r"\s+", " ", line))
    return sentences


def terminal_entropy(run, args, row):
    """Line 7 alone ("entropy ... of N allowed"), the one sentence #row .entropy holds."""
    lines = run(["explain", *args, "--row", str(row)]).split("\n")
    line = next((line for line in lines if line.startswith("7. ")), None)
    return re.sub(r"\s+", " ", line[3:]).strip() if line is not None else None


def expect_same_sentences(page, run, args, row, label):
    sentences = terminal_sentences(run, args, row)

    # Compared without whitespace: a sentence split over table cells loses its spaces in
    # textContent, and its words must still all be there in order.
    def bare(text):
        return re.sub(r"\s+", "", text)

    shown = bare(page.text_content("#row") or "")
    missing = [t for t in sentences if bare(t) not in shown]
    check(len(sentences) >= 3 and not missing,
          f"{label}: the walk-through says the terminal's {len(sentences)} sentences" +
          (' (missing: "' + '", "'.join(missing[:2]) + '")' if missing else ""))


def expect_terminal_entropy(page, run, args, row, label):
    """#row .entropy holds the terminal's line 7 for the open row, word for word."""
    sentence = terminal_entropy(run, args, row)
    expect_same_sentences(page, run, args, row, label)
    shown = squash(text_or_empty(page, "#row .entropy"))
    check(sentence is not None and shown == sentence,
          f'{label}: #row .entropy says the terminal\'s line 7 ("{shown}" vs "{sentence}")')


def no_overflow(page, label):
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.evaluate(
            "() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
        scroll, inner = page.evaluate(
            "() => [document.documentElement.scrollWidth, window.innerWidth]")
        check(scroll <= inner,
              f"{label}: no horizontal overflow at {width} px (scrollWidth {scroll})")
    page.set_viewport_size({"width": 1280, "height": 900})
    # The page redraws its maps 150 ms after the last resize (debounced): let that happen now,
    # not under a later check's locator (CI saw a zoomed cell detached by it).
    page.wait_for_timeout(400)


HEADER_WIDTHS = [360, 390, 414, 768, 1024, 1280, 1400, 1920, 2560]


def headers_fit(page, label, shots=None):
    """The Heads table's headers and the section titles each on one line, and the table
    within its box (no scrolling inside it), at every width of HEADER_WIDTHS; a screenshot of
    the Heads section at each width goes to `shots` (a folder) when given."""
    for width in HEADER_WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.evaluate(
            "() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
        wrapped, inner = page.evaluate("""() => {
          const lines = (el) => {
            const range = document.createRange();
            range.selectNodeContents(el);
            return new Set([...range.getClientRects()].filter((r) => r.width > 0)
                               .map((r) => Math.round(r.top))).size;
          };
          const headers = [...document.querySelectorAll('#summary th, main h2')];
          const box = document.querySelector('#summary').closest('.scroll');
          return [headers.filter((el) => lines(el) > 1).map((el) => el.textContent),
                  box.scrollWidth - box.clientWidth];
        }""")
        check(not wrapped, f"{label}: headers on one line at {width} px"
              + (f" (wrapped: {', '.join(wrapped)})" if wrapped else ""))
        check(inner <= 0, f"{label}: the Heads table fits its box at {width} px "
              f"({inner} px wider)")
        if shots:
            section = page.locator("#summary").locator("xpath=ancestor::section")
            section.screenshot(path=os.path.join(shots, f"heads-{label}-{width}.png"))
    page.set_viewport_size({"width": 1280, "height": 900})
    page.wait_for_timeout(400)


def masked_colour(page):
    return page.evaluate("() => document.body.dataset.maskedColour")


def expect_masked_cell_colour(page, label):
    """A masked cell's colour in the exact view: its pixel on screen is body's masked colour."""
    want = hex_colour(masked_colour(page))
    check(want is not None, label + ": body.dataset.maskedColour is #rrggbb")
    cell = page.locator("#heatmap svg rect.cell.masked").first
    if not want or cell.count() == 0:
        return check(False, label + ": a masked cell is drawn (rect.cell.masked)")
    cell.scroll_into_view_if_needed()
    pixel = pixel_at_centre(page, cell)
    return check(colour_distance(pixel, want) <= 1,
                 f"{label}: a masked cell's pixel is the masked colour ({pixel} vs {want})")


def _number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("nan")


def _stacked_sum_of_open_row(page):
    """Σ_j w_j·v_j of the drawn terms of the open row: (one g.term per film, data attributes
    present, the sum from data attributes, the sum from the titles). From data attributes (a
    term's data-weight, each coordinate's data-value = w_j·v_jc), and from the titles' printed
    contributions ("Alien (w = 0.3509): 0.3930")."""
    terms = page.eval_on_selector_all("#stacked-sum g.term[data-j]", """(gs) => gs.map((g) => ({
        data: { ...g.dataset },
        rects: Array.from(g.querySelectorAll('[data-value], [data-contribution], rect'))
          .map((r) => ({
            data: { ...r.dataset }, title: r.querySelector('title')?.textContent || '' })),
      }))""")
    from_attributes, from_titles = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    attributes = True
    for term in terms:
        coords = [r for r in term["rects"]
                  if "value" in r["data"] or "contribution" in r["data"]]
        attributes = attributes and "weight" in term["data"] and len(coords) == 3
        for c, rect in enumerate(coords[:3]):
            data = rect["data"]
            from_attributes[c] += _number(data.get("value", data.get("contribution")))
        for c, rect in enumerate(term["rects"][:3]):
            printed = re.search(r":\s*(-?[\d.]+)\s*$", rect["title"])
            from_titles[c] += _number(printed.group(1) if printed else None)
    return len(terms) == len(FILMS), attributes, from_attributes, from_titles


def builtin_checks(page, run, tolerance):
    part0 = builtin_attention(0)
    check(page.locator("#row[data-row]").count() == 1,
          "built-in: a walk-through is open on load, without a click")
    check(page.locator("#story").count() == 1 and len(squash(page.text_content("#story"))) > 40,
          "built-in: the story is shown (#story)")
    headers = page.eval_on_selector_all(
        ".vec th", "(ths) => ths.map((t) => t.textContent.trim().toLowerCase())")
    check(all(g in headers for g in GENRES),
          f"built-in: vector columns are labelled with the genres ({','.join(GENRES)})")
    check(all(g in headers for g in GIVES),
          f"built-in: value columns are labelled with what films give ({','.join(GIVES)})")
    kv_rows = squash(text_or_empty(page, "table#kv-rows"))
    check(all(f in kv_rows for f in FILMS), "built-in: table#kv-rows lists all 6 films")
    legend = page.locator('#heatmap-legend.legend[role="img"]')
    check(legend.count() == 1 and len(legend.get_attribute("aria-label") or "") > 0,
          "built-in: #heatmap-legend is an image with an aria-label")
    check(page.locator('#heatmap[role][aria-label][tabindex="0"]').count() == 1,
          "built-in: #heatmap has a role, an aria-label and tabindex 0")
    check(page.locator("#heatmap rect.cell").count() == 4 * 6,
          "built-in: the heatmap has 4 x 6 cells (users x films)")

    page.hover('#heatmap rect.cell[data-i="1"][data-j="2"]')
    tip = page.text_content("#tip")
    # The tip's numbers, each within half a unit of its last printed decimal of
    # w(Ben, Notting Hill).
    w12 = part0["w"][1][2]
    near = any(abs(float(x) - w12) <= 0.5 * 10 ** -len(x.split(".")[1]) + 1e-12
               for x in re.findall(r"-?\d+\.\d{2,}", tip))
    check("Ben" in tip and "Notting Hill" in tip and near,
          "built-in: hovering (Ben, Notting Hill) names both and the weight "
          f'{w12:.4f} ("{squash(tip)}")')

    # Each user's row against the float64 worked example; the stacked sum rebuilds O_i.
    worst = worst_sum = worst_titles = 0.0
    terms_ok = data_attributes = True
    for i, user in enumerate(USERS):
        page.click(f'#heatmap rect.cell[data-i="{i}"][data-j="0"]')
        worst = max(worst, compare_row(row_weights(page), part0["w"][i], tolerance)[0])
        check(user in page.text_content("#row h2"),
              f"built-in: the walk-through of row {i} names {user}")
        one_per_film, attributes, o, from_titles = _stacked_sum_of_open_row(page)
        terms_ok = terms_ok and one_per_film
        data_attributes = data_attributes and attributes
        if attributes:
            worst_sum = max(worst_sum, *(gap(x, part0["o"][i][c]) for c, x in enumerate(o)))
        worst_titles = max(worst_titles,
                           *(gap(x, part0["o"][i][c]) for c, x in enumerate(from_titles)))
    check(worst <= tolerance,
          f"built-in: every user's row equals the worked example (max diff {format_exp(worst)})")
    check(terms_ok, "built-in: #stacked-sum has one g.term per film")
    check(data_attributes and worst_sum <= tolerance,
          f"built-in: #stacked-sum data attributes add up to O_i (max diff {format_exp(worst_sum)})"
          if data_attributes else "built-in: #stacked-sum g.term carries data-weight, and each "
          "coordinate rect data-value = w_j·v_jc (missing)")
    # The titles print 4 decimals, so six terms may be off by 6 x 5e-5.
    check(worst_titles <= 6 * 5e-5 + 1e-9, "built-in: #stacked-sum terms as drawn (titles, "
          f"4 decimals) add up to O_i (max diff {format_exp(worst_titles)})")

    # The page says the terminal's entropy sentence for the same row.
    page.click('#heatmap rect.cell[data-i="1"][data-j="0"]')
    expect_terminal_entropy(page, run, [], 1, "built-in")

    # The keyboard: arrows move the cursor, Enter opens its row, the status names the cell.
    page.focus("#heatmap")
    for key in ["ArrowDown", "ArrowDown", "ArrowRight"]:
        page.keyboard.press(key)
    cursor = str(page.get_attribute("#heatmap", "data-cursor"))
    page.keyboard.press("Enter")
    well_formed = re.fullmatch(r"\d+,\d+", cursor) is not None
    ci, cj = (int(x) for x in cursor.split(",")) if well_formed else (-1, -1)
    check(well_formed and page.get_attribute("#row", "data-row") == str(ci),
          f"built-in: arrows then Enter open the cursor's row (cursor {cursor})")
    status = squash(text_or_empty(page, "#heatmap-status"))
    check(0 <= ci < 4 and 0 <= cj < 6 and USERS[ci] in status and FILMS[cj] in status,
          f'built-in: #heatmap-status announces the cell ("{status}")')
    # The cursor stops at the map's edges.
    page.focus("#heatmap")
    for _ in range(10):
        page.keyboard.press("ArrowUp")
    for _ in range(10):
        page.keyboard.press("ArrowRight")
    check(page.get_attribute("#heatmap", "data-cursor") == "0,5",
          "built-in: the cursor stops at the top right cell (0,5)")
    check(page.locator('#heatmap-status[aria-live], #heatmap-status[role="status"]').count() == 1,
          "built-in: #heatmap-status is a live region")

    # Part 1 is cross-attention: no distance column; part 2, the films, has 6 x 6 cells.
    check(not re.search("distance", page.text_content("#summary"), re.IGNORECASE),
          "built-in part 1 (cross-attention): no distance column")
    check(page.locator("#batch").is_hidden(), "built-in: #batch is hidden (one batch element)")
    page.select_option("#part", "1")
    check(page.locator("#heatmap rect.cell").count() == 6 * 6, "built-in: part 2 has 6 x 6 cells")
    part1 = builtin_attention(1)
    page.click('#heatmap rect.cell[data-i="4"][data-j="0"]')
    worst, why = compare_row(row_weights(page), part1["w"][4], tolerance)
    check(worst <= tolerance, "built-in part 2: The Matrix's row equals the worked example " + why)
    page.select_option("#part", "0")
