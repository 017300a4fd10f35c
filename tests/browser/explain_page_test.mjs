// The explain page in a real browser: Debian's headless Chromium driven by playwright-core.
//
//   node explain_page_test.mjs --qkv build/qkv --work DIR [--screenshot docs/explain.png]
//
// For three pages (the built-in example; Q, K, V files with a causal rule and a bool mask;
// n = 1024, pooled) it checks: no console error and no network request; the heatmap has the
// right number of cells; hovering names the cell; clicking a cell opens that row's walk-through, whose weights equal
// `qkv attention --kernel reference --weights` within 1e-6; a screenshot is not blank.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const CHROMIUM = '/usr/bin/chromium';
const TOLERANCE = 1e-6;

function arg(name, fallback) {
  const at = process.argv.indexOf(name);
  return at > 0 ? process.argv[at + 1] : fallback;
}
const qkv = path.resolve(arg('--qkv', 'build/qkv'));
const work = path.resolve(arg('--work', fs.mkdtempSync(path.join(os.tmpdir(), 'qkv-browser-'))));
const screenshotCopy = arg('--screenshot', null);
fs.rmSync(work, { recursive: true, force: true });
fs.mkdirSync(work, { recursive: true });

let failures = 0;
function check(ok, what) {
  console.log((ok ? 'ok    ' : 'FAIL  ') + what);
  if (!ok) failures += 1;
}

// ---- .npy files, written and read here so that the test needs nothing but node ----
function writeNpy(file, shape, values, dtype = '<f8') {
  const dict = "{'descr': '" + dtype + "', 'fortran_order': False, 'shape': (" +
    shape.join(', ') + (shape.length === 1 ? ',' : '') + '), }';
  let header = dict + ' '.repeat(64 - ((10 + dict.length + 1) % 64)) + '\n';
  const head = Buffer.alloc(10);
  Buffer.from([0x93]).copy(head, 0);
  head.write('NUMPY', 1, 'latin1');
  head[6] = 1; head[7] = 0;
  head.writeUInt16LE(header.length, 8);
  const body = dtype === '|b1' ? Buffer.from(values.map((v) => (v ? 1 : 0)))
    : Buffer.from(new Float64Array(values).buffer);
  fs.writeFileSync(file, Buffer.concat([head, Buffer.from(header, 'latin1'), body]));
}

function readNpyF64(file) {
  const bytes = fs.readFileSync(file);
  const length = bytes.readUInt16LE(8);
  const header = bytes.subarray(10, 10 + length).toString('latin1');
  if (!header.includes("'<f8'")) throw new Error(file + ': expected <f8, got ' + header);
  const shape = header.match(/\(([^)]*)\)/)[1].split(',').filter((s) => s.trim()).map(Number);
  const data = bytes.subarray(10 + length);
  return { shape, values: new Float64Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.length)) };
}

// A small deterministic generator (the values only need to be reproducible).
function random(seed) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296) * 2 - 1;
}
function randomValues(count, seed, spread = 1) {
  const next = random(seed);
  return Array.from({ length: count }, () => next() * spread);
}

function run(args) {
  return execFileSync(qkv, args, { cwd: work, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

// ---- the browser ----
async function withPage(context, file, body) {
  const page = await context.newPage();
  const problems = [];
  page.on('console', (m) => { if (m.type() === 'error') problems.push('console: ' + m.text()); });
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('request', (r) => { if (!r.url().startsWith('file:')) problems.push('request: ' + r.url()); });
  page.on('requestfailed', (r) => problems.push('failed request: ' + r.url()));
  await page.goto('file://' + file);
  await page.waitForSelector('body[data-ready="1"]', { timeout: 30000 });
  await body(page);
  check(problems.length === 0, path.basename(file) + ': no console error and no network request' +
    (problems.length ? ' (' + problems.slice(0, 3).join('; ') + ')' : ''));
  await page.close();
}

// Weights of the open row walk-through, every key, as the page shows them: #row-all lists the
// allowed keys (a masked key's weight is 0).
async function rowWeights(page, nk) {
  await page.waitForSelector('#row-all tr[data-j]', { state: 'attached' });
  const listed = await page.$$eval('#row-all tr[data-j]', (rows) => rows.map((r) => [Number(r.dataset.j), Number(r.dataset.weight)]));
  const weights = new Array(nk).fill(0);
  for (const [j, w] of listed) weights[j] = w;
  return weights;
}

function maxDiff(a, b) {
  if (a.length !== b.length) return Infinity;
  let d = 0;
  for (let n = 0; n < a.length; ++n) d = Math.max(d, Math.abs(a[n] - b[n]));
  return d;
}

// Not blank: the screenshot decoded in the page has many pixels unlike its corner.
async function notBlank(page, png) {
  const bytes = Array.from(png);
  return page.evaluate(async (data) => {
    const bitmap = await createImageBitmap(new Blob([new Uint8Array(data)], { type: 'image/png' }));
    const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
    const ctx = canvas.getContext('2d');
    ctx.drawImage(bitmap, 0, 0);
    const px = ctx.getImageData(0, 0, bitmap.width, bitmap.height).data;
    let different = 0;
    for (let n = 0; n < px.length; n += 4) {
      if (Math.abs(px[n] - px[0]) + Math.abs(px[n + 1] - px[1]) + Math.abs(px[n + 2] - px[2]) > 30) ++different;
    }
    return different / (px.length / 4);
  }, bytes);
}

async function main() {
  if (!fs.existsSync(CHROMIUM)) throw new Error(CHROMIUM + ' is missing: run scripts/install-deps.sh');

  // 1. The built-in example.
  const builtin = path.join(work, 'builtin.html');
  run(['explain', '--html', builtin]);
  // 2. Q, K, V files: two query heads sharing one kv head, causal, and a bool mask.
  const [h, nq, nk, d, dv] = [2, 40, 48, 16, 8];
  writeNpy(path.join(work, 'q.npy'), [h, nq, d], randomValues(h * nq * d, 1, 2));
  writeNpy(path.join(work, 'k.npy'), [1, nk, d], randomValues(nk * d, 2, 2));
  writeNpy(path.join(work, 'v.npy'), [1, nk, dv], randomValues(nk * dv, 3));
  writeNpy(path.join(work, 'mask.npy'), [nq, nk], randomValues(nq * nk, 4).map((x) => x > -0.6), '|b1');
  const files = ['--q', 'q.npy', '--k', 'k.npy', '--v', 'v.npy', '--causal', '--mask', 'mask.npy'];
  const masked = path.join(work, 'masked.html');
  run(['explain', ...files, '--html', masked]);
  run(['attention', ...files, '--kernel', 'reference', '--out-dtype', 'f64', '--out', 'o.npy',
    '--weights', 'w.npy']);
  const reference = readNpyF64(path.join(work, 'w.npy'));
  // 3. A longer input: the overview is pooled, a click zooms into exact cells.
  const n = 1024;
  writeNpy(path.join(work, 'q2.npy'), [n, d], randomValues(n * d, 5, 2));
  writeNpy(path.join(work, 'k2.npy'), [n, d], randomValues(n * d, 6, 2));
  writeNpy(path.join(work, 'v2.npy'), [n, dv], randomValues(n * dv, 7));
  const long = ['--q', 'q2.npy', '--k', 'k2.npy', '--v', 'v2.npy', '--window', '200,0'];
  const pooled = path.join(work, 'pooled.html');
  run(['explain', ...long, '--html', pooled]);
  run(['attention', ...long, '--kernel', 'reference', '--out-dtype', 'f64', '--out', 'o2.npy',
    '--weights', 'w2.npy']);
  const reference2 = readNpyF64(path.join(work, 'w2.npy'));

  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'qkv-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1280, height: 900 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--no-first-run'],
  });
  try {
    await withPage(context, builtin, async (page) => {
      check(await page.locator('#heatmap rect.cell').count() === 4 * 6,
        'built-in: the heatmap has 4 x 6 cells (users x films)');
      await page.hover('#heatmap rect.cell[data-i="1"][data-j="2"]');
      const tip = await page.textContent('#tip');
      check(tip.includes('Ben') && tip.includes('Notting Hill') && tip.includes('score s = 2.0000') &&
        tip.includes('weight w = 0.32'), 'built-in: hovering a cell names i, j, their labels, the score and the weight');
      await page.click('#heatmap rect.cell[data-i="0"][data-j="4"]');
      const weights = await rowWeights(page, 6);
      // Ana's weights, worked out by hand from the example's numbers (see walk_through_test.cc).
      const scores = [2.0, 1.0, 0.0, 0.1, 2.06, 0.0];
      const sum = scores.reduce((s, x) => s + Math.exp(x), 0);
      check(maxDiff(weights, scores.map((x) => Math.exp(x) / sum)) < TOLERANCE,
        'built-in: clicking Ana\'s row shows her weights');
      check((await page.textContent('#row h2')).includes('Ana'), 'built-in: the walk-through names the row');
      const png = await page.screenshot({ path: path.join(work, 'explain.png'), fullPage: true });
      const share = await notBlank(page, png);
      check(share > 0.02, 'built-in: the screenshot is not blank (' + (100 * share).toFixed(1) + '% of pixels drawn)');
      await page.selectOption('#part', '1');
      check(await page.locator('#heatmap rect.cell').count() === 6 * 6, 'built-in: part 2 has 6 x 6 cells');
    });

    await withPage(context, masked, async (page) => {
      check(await page.locator('#heatmap rect.cell').count() === nq * nk, 'masked: the heatmap has 40 x 48 cells');
      check(await page.locator('#mask canvas').count() === 1, 'masked: the mask pattern is drawn');
      check(await page.locator('#summary tr.head-row').count() === h, 'masked: one summary row per head');
      let worst = 0;
      for (const [head, row] of [[0, 0], [0, 17], [1, 5], [1, 39]]) {
        await page.selectOption('#head', String(head));
        await page.click('#heatmap rect.cell[data-i="' + row + '"][data-j="0"]');
        const want = reference.values.slice((head * nq + row) * nk, (head * nq + row + 1) * nk);
        worst = Math.max(worst, maxDiff(await rowWeights(page, nk), Array.from(want)));
      }
      check(worst < TOLERANCE, 'masked: clicked rows equal the reference weights (max diff ' + worst.toExponential(2) + ')');
      const png = await page.screenshot();
      check(await notBlank(page, png) > 0.02, 'masked: the screenshot is not blank');
    });

    await withPage(context, pooled, async (page) => {
      const canvas = page.locator('#heatmap canvas');
      check(await canvas.count() === 1 && await canvas.getAttribute('data-rows') === '512' &&
        await canvas.getAttribute('data-cols') === '512', 'pooled: the overview is 512 x 512 max-pooled cells');
      const box = await canvas.boundingBox();
      await page.mouse.click(box.x + box.width * 0.5, box.y + box.height * 0.5);
      check(await page.locator('#heatmap rect.cell').count() === 64 * 64, 'pooled: a click zooms into 64 x 64 exact cells');
      const first = await page.locator('#heatmap rect.cell').first();
      const row = Number(await first.getAttribute('data-i'));
      await first.click();
      const want = Array.from(reference2.values.slice(row * n, (row + 1) * n));
      const diff = maxDiff(await rowWeights(page, n), want);
      check(diff < TOLERANCE, 'pooled: the zoomed row ' + row + ' equals the reference (max diff ' + diff.toExponential(2) + ')');
    });
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  if (screenshotCopy) fs.copyFileSync(path.join(work, 'explain.png'), screenshotCopy);
  console.log(failures ? failures + ' check(s) failed' : 'all checks passed');
  process.exit(failures ? 1 : 0);
}

main().catch((e) => {
  console.error('browser test: ' + (e.stack || e));
  process.exit(1);
});
