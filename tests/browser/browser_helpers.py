"""Helpers of the explain page tests: checks, .npy inputs, the qkv command, the browser, and
reading pixels. Nothing here knows what the page should show.

The browser is Debian's /usr/bin/chromium driven by PyPI's playwright (sync API, pinned in
requirements.txt): playwright's own browser download is never used."""

import base64
import contextlib
import math
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

CHROMIUM = "/usr/bin/chromium"
DEFAULT_VIEWPORT = {"width": 1280, "height": 900}

_failures = 0


def check(ok, what):
    global _failures
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        _failures += 1
    return ok


def failure_count():
    return _failures


def gap(a, b):
    """|a - b|, infinite when either is NaN: a missing number must fail a `<= tolerance`."""
    d = abs(a - b)
    return math.inf if math.isnan(d) else d


def squash(text):
    return " ".join((text or "").split())


def format_exp(x):
    return f"{x:.2e}"


# ---- inputs ----
_LCG_MULTIPLIER, _LCG_INCREMENT, _LCG_MODULUS = 1664525, 1013904223, 1 << 32
_LCG_BLOCK = 4096


def _lcg_block_tables():
    # s_k = A_k·s_0 + C_k (mod 2^32) for k = 1..block: a block of states from its start state in
    # one vector step, so that the 4M-value masks take milliseconds, not a Python loop.
    multipliers = np.empty(_LCG_BLOCK, dtype=np.uint64)
    increments = np.empty(_LCG_BLOCK, dtype=np.uint64)
    a, c = 1, 0
    for k in range(_LCG_BLOCK):
        a = (a * _LCG_MULTIPLIER) % _LCG_MODULUS
        c = (c * _LCG_MULTIPLIER + _LCG_INCREMENT) % _LCG_MODULUS
        multipliers[k], increments[k] = a, c
    return multipliers, increments


_LCG_TABLES = _lcg_block_tables()


def random_values(count, seed, spread=1.0):
    """`count` values in [-spread, spread) from a small deterministic generator (the values only
    need to be reproducible): the states of s -> 1664525 s + 1013904223 (mod 2^32) after seed."""
    multipliers, increments = _LCG_TABLES
    states = np.empty(count, dtype=np.uint64)
    state = np.uint64(seed % _LCG_MODULUS)
    for begin in range(0, count, _LCG_BLOCK):
        end = min(begin + _LCG_BLOCK, count)
        # A_k, s < 2^32 and C_k < 2^32: the sum stays below 2^64 before the reduction.
        block = (multipliers[: end - begin] * state + increments[: end - begin]) & np.uint64(
            _LCG_MODULUS - 1)
        states[begin:end] = block
        state = block[-1]
    return (states.astype(np.float64) / 4294967296.0 * 2.0 - 1.0) * spread


def write_npy(file, shape, values, dtype=np.float64):
    np.save(file, np.asarray(values, dtype=dtype).reshape(shape))


def read_npy_f64(file):
    """The values of a float64 .npy file, flat (row-major)."""
    array = np.load(file)
    if array.dtype != np.dtype("<f8"):
        raise ValueError(f"{file}: expected <f8, got {array.dtype.str}")
    return array.reshape(-1)


def runner(qkv, work):
    def run(args):
        return subprocess.run([qkv, *args], cwd=work, check=True, capture_output=True,
                              encoding="utf-8").stdout
    return run


# ---- the browser ----
@contextlib.contextmanager
def chromium_context(playwright, viewport=DEFAULT_VIEWPORT):
    """A persistent context of Debian's headless Chromium in a fresh profile, removed after."""
    if not os.path.exists(CHROMIUM):
        raise RuntimeError(CHROMIUM + " is missing: run scripts/install-deps.sh")
    profile = tempfile.mkdtemp(prefix="qkv-chromium-")
    try:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, viewport=viewport,
            # --no-sandbox: the tests run as root in containers, where Chromium's sandbox refuses.
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--force-color-profile=srgb"])
        try:
            yield context
        finally:
            context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def with_page(context, file, body, viewport=None):
    """Opens `file`, waits for body[data-ready="1"], runs `body(page)`; checks that the page
    logged no error and asked for nothing over the network. An exception in `body` is one
    failure, and the remaining pages still run."""
    page = context.new_page()
    page.set_default_timeout(10000)
    if viewport:
        page.set_viewport_size(viewport)
    problems = []

    def on_console(message):
        if message.type == "error":
            problems.append("console: " + message.text)

    def on_request(request):
        if not request.url.startswith("file:") and not request.url.startswith("data:"):
            problems.append("request: " + request.url)

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append("page error: " + error.message))
    page.on("request", on_request)
    page.on("requestfailed", lambda request: problems.append("failed request: " + request.url))
    name = os.path.basename(file)
    try:
        page.goto("file://" + file)
        page.wait_for_selector('body[data-ready="1"]', timeout=60000, state="attached")
        body(page)
    except Exception as error:  # any failure of one page is reported, and the next page runs
        check(False, name + ": " + (str(error).split("\n")[0] or type(error).__name__))
    check(not problems, name + ": no console error and no network request" +
          (" (" + "; ".join(problems[:3]) + ")" if problems else ""))
    page.close()


def text_or_empty(page, selector):
    """The element's textContent, or "" when it is missing (a failed check, not an exception)."""
    try:
        return page.text_content(selector) or ""
    except Exception:
        return ""


def row_weights(page):
    """Keys and weights of the open row walk-through, as the page lists them: [(j, w)]."""
    page.wait_for_selector("#row-all tr[data-j]", state="attached", timeout=10000)
    rows = page.eval_on_selector_all(
        "#row-all tr[data-j]",
        "(rows) => rows.map((r) => [Number(r.dataset.j), Number(r.dataset.weight)])")
    return [(j, w) for j, w in rows]


def compare_row(listed, want, tolerance, top=False):
    """The listed weights against a reference row (nk entries): every listed key's weight within
    `tolerance`, every key not listed exactly 0 in the reference, heaviest first. Returns
    (worst difference, why): infinite for a listed key twice or out of range, or a missing
    weight. With `top` (a sampled row, which keeps only its heaviest keys): the listed keys must
    be the heaviest ones, every unlisted key weighing no more than the lightest listed one."""
    worst = 0.0
    seen = set()
    for j, w in listed:
        if not (isinstance(j, (int, float)) and math.isfinite(j) and j == int(j)
                and 0 <= j < len(want)) or int(j) in seen:
            return math.inf, f"key {j}"
        seen.add(int(j))
        worst = max(worst, gap(w, want[int(j)]))
    lightest = min(want[int(j)] for j, _ in listed) if top and listed else 0.0
    for j in range(len(want)):
        if j not in seen and want[j] > (lightest + tolerance if top else 0.0):
            return math.inf, f"key {j} (weight {want[j]}) not listed"
    for n in range(1, len(listed)):
        if listed[n][1] > listed[n - 1][1] + tolerance:
            return math.inf, f"not heaviest first at {n}"
    return worst, "" if worst <= tolerance else "max diff " + format_exp(worst)


# ---- pixels ----
def decode_png(page, png):
    """Decodes a PNG (a screenshot) in the page: (width, height, RGBA uint8 array [h, w, 4])."""
    width, height, rgba = page.evaluate(
        """async (b64) => {
          const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
          const bitmap = await createImageBitmap(new Blob([bytes], { type: 'image/png' }));
          const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
          const ctx = canvas.getContext('2d');
          ctx.drawImage(bitmap, 0, 0);
          const data = ctx.getImageData(0, 0, bitmap.width, bitmap.height).data;
          // Back as base64, in chunks (a spread of millions of arguments overflows the stack).
          let binary = '';
          for (let n = 0; n < data.length; n += 0x8000) {
            binary += String.fromCharCode.apply(null, data.subarray(n, n + 0x8000));
          }
          return [bitmap.width, bitmap.height, btoa(binary)];
        }""", base64.b64encode(png).decode("ascii"))
    pixels = np.frombuffer(base64.b64decode(rgba), dtype=np.uint8)
    return width, height, pixels.reshape(height, width, 4)


def pixel_at_centre(page, locator):
    """The colour at the centre of an element, from a screenshot of the page at scale 1."""
    box = locator.bounding_box()
    if not box:
        raise RuntimeError("no box for the element")
    x, y = math.floor(box["x"] + box["width"] / 2), math.floor(box["y"] + box["height"] / 2)
    png = page.screenshot(clip={"x": x, "y": y, "width": 1, "height": 1}, scale="css")
    _, _, pixels = decode_png(page, png)
    return [int(v) for v in pixels[0, 0, :3]]


def hex_colour(text):
    match = re.fullmatch(r"#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})", text or "", re.IGNORECASE)
    return [int(part, 16) for part in match.groups()] if match else None


def colour_distance(a, b):
    return max(abs(a[k] - b[k]) for k in range(3))


def drawn_share(pixels):
    """Share of pixels unlike the image's first pixel (sum of |ΔRGB| > 30): not blank."""
    rgb = pixels[..., :3].reshape(-1, 3).astype(np.int32)
    different = np.abs(rgb - rgb[0]).sum(axis=1) > 30
    return float(different.mean())


def canvas_stats(page, selector):
    """The luminance mean and variance of a canvas's own pixels (read in the page, not from a
    screenshot)."""
    return page.eval_on_selector(selector, """(canvas) => {
        const ctx = canvas.getContext('2d');
        const { data } = ctx.getImageData(0, 0, canvas.width, canvas.height);
        let sum = 0, sum2 = 0;
        const n = data.length / 4;
        for (let p = 0; p < data.length; p += 4) {
          const y = 0.2126 * data[p] + 0.7152 * data[p + 1] + 0.0722 * data[p + 2];
          sum += y; sum2 += y * y;
        }
        const mean = sum / n;
        const variance = sum2 / n - mean * mean;
        return { width: canvas.width, height: canvas.height, mean, variance };
      }""")


def canvas_cell_luminances(page, selector, step, strictly_lower):
    """Luminance at the centre of every `step`-th cell of the canvas's data-rows x data-cols grid
    (with `strictly_lower`, only cells wholly below the diagonal: col < row)."""
    return page.eval_on_selector(selector, """(canvas, [s, lower]) => {
        const rows = Number(canvas.dataset.rows), cols = Number(canvas.dataset.cols);
        const { data } = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height);
        const out = [];
        for (let r = 0; r < rows; r += s) {
          for (let c = 0; c < cols; c += s) {
            if (lower && c >= r) continue;
            const x = Math.floor((c + 0.5) * canvas.width / cols);
            const y = Math.floor((r + 0.5) * canvas.height / rows);
            const p = 4 * (y * canvas.width + x);
            out.push(0.2126 * data[p] + 0.7152 * data[p + 1] + 0.0722 * data[p + 2]);
          }
        }
        return out;
      }""", [step, strictly_lower])


def canvas_cell_pixel(page, selector, row, col):
    """The canvas's own pixel at cell (row, col) of its data-rows x data-cols grid."""
    return page.eval_on_selector(selector, """(canvas, [r, c]) => {
        const rows = Number(canvas.dataset.rows), cols = Number(canvas.dataset.cols);
        const x = Math.floor((c + 0.5) * canvas.width / cols);
        const y = Math.floor((r + 0.5) * canvas.height / rows);
        return Array.from(canvas.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3));
      }""", [row, col])
