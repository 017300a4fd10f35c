// Helpers of the explain page tests: arguments, checks, .npy files, the qkv command, the
// browser, and reading pixels. Nothing here knows what the page should show.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const CHROMIUM = '/usr/bin/chromium';

// playwright-core from this folder's node_modules (scripts/install-deps.sh runs `npm ci` here).
export async function loadChromium() {
  try {
    return (await import('playwright-core')).chromium;
  } catch (e) {
    throw new Error('playwright-core is missing: run `npm ci` in tests/browser (' + e.message + ')');
  }
}

export function arg(name, fallback) {
  const at = process.argv.indexOf(name);
  return at > 0 ? process.argv[at + 1] : fallback;
}

let failures = 0;
export function check(ok, what) {
  console.log((ok ? 'ok    ' : 'FAIL  ') + what);
  if (!ok) failures += 1;
  return ok;
}
export function failureCount() { return failures; }

// ---- .npy files, written and read here so that the test needs nothing but node ----
export function writeNpy(file, shape, values, dtype = '<f8') {
  const dict = "{'descr': '" + dtype + "', 'fortran_order': False, 'shape': (" +
    shape.join(', ') + (shape.length === 1 ? ',' : '') + '), }';
  const header = dict + ' '.repeat(64 - ((10 + dict.length + 1) % 64)) + '\n';
  const head = Buffer.alloc(10);
  head[0] = 0x93;
  head.write('NUMPY', 1, 'latin1');
  head[6] = 1; head[7] = 0;
  head.writeUInt16LE(header.length, 8);
  const body = dtype === '|b1' ? Buffer.from(values.map((v) => (v ? 1 : 0)))
    : Buffer.from(new Float64Array(values).buffer);
  fs.writeFileSync(file, Buffer.concat([head, Buffer.from(header, 'latin1'), body]));
}

export function readNpyF64(file) {
  const bytes = fs.readFileSync(file);
  const length = bytes.readUInt16LE(8);
  const header = bytes.subarray(10, 10 + length).toString('latin1');
  if (!header.includes("'<f8'")) throw new Error(file + ': expected <f8, got ' + header);
  const shape = header.match(/\(([^)]*)\)/)[1].split(',').filter((s) => s.trim()).map(Number);
  const data = bytes.subarray(10 + length);
  return { shape, values: new Float64Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.length)) };
}

// A small deterministic generator (the values only need to be reproducible).
export function random(seed) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296) * 2 - 1;
}
export function randomValues(count, seed, spread = 1) {
  const next = random(seed);
  return Array.from({ length: count }, () => next() * spread);
}

export function runner(qkv, work) {
  return (args) => execFileSync(qkv, args, {
    cwd: work, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 1 << 28,
  });
}

export function maxDiff(a, b) {
  if (a.length !== b.length) return Infinity;
  let d = 0;
  for (let n = 0; n < a.length; ++n) d = Math.max(d, Math.abs(a[n] - b[n]));
  return d;
}

// ---- the browser ----
export async function launch(chromium, viewport = { width: 1280, height: 900 }) {
  if (!fs.existsSync(CHROMIUM)) throw new Error(CHROMIUM + ' is missing: run scripts/install-deps.sh');
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'qkv-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--no-first-run', '--force-color-profile=srgb'],
  });
  return {
    context,
    async close() {
      await context.close();
      fs.rmSync(profile, { recursive: true, force: true });
    },
  };
}

// Opens `file`, waits for body[data-ready="1"], runs `body(page)`; checks that the page logged
// no error and asked for nothing over the network. An exception in `body` is one failure, and
// the remaining pages still run.
export async function withPage(context, file, body, viewport) {
  const page = await context.newPage();
  page.setDefaultTimeout(10000);
  if (viewport) await page.setViewportSize(viewport);
  const problems = [];
  page.on('console', (m) => { if (m.type() === 'error') problems.push('console: ' + m.text()); });
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('request', (r) => { if (!r.url().startsWith('file:') && !r.url().startsWith('data:')) problems.push('request: ' + r.url()); });
  page.on('requestfailed', (r) => problems.push('failed request: ' + r.url()));
  const name = path.basename(file);
  try {
    await page.goto('file://' + file);
    await page.waitForSelector('body[data-ready="1"]', { timeout: 60000, state: 'attached' });
    await body(page);
  } catch (e) {
    check(false, name + ': ' + String(e.message || e).split('\n')[0]);
  }
  check(problems.length === 0, name + ': no console error and no network request' +
    (problems.length ? ' (' + problems.slice(0, 3).join('; ') + ')' : ''));
  await page.close();
}

// Keys and weights of the open row walk-through, as the page lists them.
export async function rowWeights(page) {
  await page.waitForSelector('#row-all tr[data-j]', { state: 'attached', timeout: 10000 });
  return page.$$eval('#row-all tr[data-j]', (rows) =>
    rows.map((r) => ({ j: Number(r.dataset.j), w: Number(r.dataset.weight) })));
}

// The listed weights against a reference row (nk entries): every listed key's weight within
// `tolerance`, every key not listed exactly 0 in the reference, heaviest first. Returns the
// worst difference (Infinity for a listed key twice or out of range, or a missing weight).
// With `top` (a sampled row, which keeps only its heaviest keys): the listed keys must be the
// heaviest ones, every unlisted key weighing no more than the lightest listed one.
export function compareRow(listed, want, tolerance, top = false) {
  let worst = 0;
  const seen = new Set();
  for (const { j, w } of listed) {
    if (!(j >= 0 && j < want.length) || seen.has(j)) return { worst: Infinity, why: 'key ' + j };
    seen.add(j);
    worst = Math.max(worst, Math.abs(w - want[j]));
  }
  const lightest = top && listed.length ? Math.min(...listed.map(({ j }) => want[j])) : 0;
  for (let j = 0; j < want.length; ++j) {
    if (!seen.has(j) && want[j] > (top ? lightest + tolerance : 0)) {
      return { worst: Infinity, why: 'key ' + j + ' (weight ' + want[j] + ') not listed' };
    }
  }
  for (let n = 1; n < listed.length; ++n) {
    if (listed[n].w > listed[n - 1].w + tolerance) return { worst: Infinity, why: 'not heaviest first at ' + n };
  }
  return { worst, why: worst <= tolerance ? '' : 'max diff ' + worst.toExponential(2) };
}

// ---- pixels ----
// Decodes a PNG (a screenshot) in the page and returns { width, height, data } (RGBA).
export async function decodePng(page, png) {
  return page.evaluate(async (b64) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const bitmap = await createImageBitmap(new Blob([bytes], { type: 'image/png' }));
    const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
    const ctx = canvas.getContext('2d');
    ctx.drawImage(bitmap, 0, 0);
    const img = ctx.getImageData(0, 0, bitmap.width, bitmap.height);
    return { width: img.width, height: img.height, data: Array.from(img.data) };
  }, Buffer.from(png).toString('base64'));
}

// The colour at the centre of an element, from a screenshot of the page at scale 1.
export async function pixelAtCentre(page, locator) {
  const box = await locator.boundingBox();
  if (!box) throw new Error('no box for the element');
  const x = Math.floor(box.x + box.width / 2), y = Math.floor(box.y + box.height / 2);
  const png = await page.screenshot({ clip: { x, y, width: 1, height: 1 }, scale: 'css' });
  const img = await decodePng(page, png);
  return img.data.slice(0, 3);
}

export function hexColour(hex) {
  const m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(hex || '');
  return m ? [1, 2, 3].map((k) => parseInt(m[k], 16)) : null;
}

export function colourDistance(a, b) {
  return Math.max(...[0, 1, 2].map((k) => Math.abs(a[k] - b[k])));
}

// Share of pixels unlike the image's first pixel (sum of |ΔRGB| > 30): not blank.
export function drawnShare(img) {
  const px = img.data;
  let different = 0;
  for (let n = 0; n < px.length; n += 4) {
    if (Math.abs(px[n] - px[0]) + Math.abs(px[n + 1] - px[1]) + Math.abs(px[n + 2] - px[2]) > 30) ++different;
  }
  return different / (px.length / 4);
}

// The luminance variance of a canvas's own pixels (read in the page, not from a screenshot).
export async function canvasStats(page, selector) {
  return page.$eval(selector, (canvas) => {
    const ctx = canvas.getContext('2d');
    const { data } = ctx.getImageData(0, 0, canvas.width, canvas.height);
    let sum = 0, sum2 = 0;
    const n = data.length / 4;
    for (let p = 0; p < data.length; p += 4) {
      const y = 0.2126 * data[p] + 0.7152 * data[p + 1] + 0.0722 * data[p + 2];
      sum += y; sum2 += y * y;
    }
    const mean = sum / n;
    return { width: canvas.width, height: canvas.height, mean, variance: sum2 / n - mean * mean };
  });
}

// Luminance at the centre of every `step`-th cell of the canvas's data-rows x data-cols grid
// (with `strictlyLower`, only cells wholly below the diagonal: col < row).
export async function canvasCellLuminances(page, selector, step, strictlyLower) {
  return page.$eval(selector, (canvas, [s, lower]) => {
    const rows = Number(canvas.dataset.rows), cols = Number(canvas.dataset.cols);
    const { data } = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height);
    const out = [];
    for (let r = 0; r < rows; r += s) {
      for (let c = 0; c < cols; c += s) {
        if (lower && c >= r) continue;
        const x = Math.floor((c + 0.5) * canvas.width / cols), y = Math.floor((r + 0.5) * canvas.height / rows);
        const p = 4 * (y * canvas.width + x);
        out.push(0.2126 * data[p] + 0.7152 * data[p + 1] + 0.0722 * data[p + 2]);
      }
    }
    return out;
  }, [step, strictlyLower]);
}

// The canvas's own pixel at cell (row, col) of its data-rows x data-cols grid.
export async function canvasCellPixel(page, selector, row, col) {
  return page.$eval(selector, (canvas, [r, c]) => {
    const rows = Number(canvas.dataset.rows), cols = Number(canvas.dataset.cols);
    const x = Math.floor((c + 0.5) * canvas.width / cols), y = Math.floor((r + 0.5) * canvas.height / rows);
    return Array.from(canvas.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3));
  }, [row, col]);
}
