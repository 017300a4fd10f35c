// The explain page in a real browser: Debian's headless Chromium driven by playwright-core.
//
//   node explain_page_test.mjs --qkv build/qkv --work DIR [--screenshots docs] [--only NAME,..]
//
// Pages: the built-in example; Q, K, V files (two query heads on one kv head, causal + a bool
// mask), also opened at --head 1 (and --row 17); a row with no allowed key; a sink; a batched
// input (also opened at --batch 1 --row 7); cross-attention (layer form with --memory); the
// layer form with --wqkv, --bqkv and --linear-layout against `qkv layer`; n = 1024 with a window
// (pooled, zoomed); n = 2048 with a float mask (sampled rows); n = 4096 random and causal.
// Expected numbers come from outside the page: the built-in example worked out here in float64
// (builtin_example.mjs), or `qkv attention --kernel reference --weights --out-dtype f64`.
// Tolerance 1e-6 on weights: explain and `qkv attention` without --kernel compute in float32
// (fused_hwy, for float64 files too), which agrees with the float64 reference kernel within
// ~2e-7 on these inputs; the built-in example runs the reference kernel (~1e-16). 1e-6 is far
// below any mistake (a wrong key, scale or mask moves a weight by > 1e-3).
// --screenshots DIR writes explain.png (built-in, 1400 px), explain-mobile.png (360 px) and
// explain-large.png (n = 4096 causal) for the README; the default run (ctest) writes none.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  arg, canvasCellLuminances, canvasCellPixel, canvasStats, check, colourDistance, compareRow, decodePng, drawnShare,
  failureCount, hexColour, launch, loadChromium, pixelAtCentre, randomValues, readNpyF64,
  rowWeights, runner, withPage, writeNpy,
} from './lib.mjs';
import { builtinAttention, FILMS, GENRES, GIVES, USERS } from './builtin_example.mjs';

const TOLERANCE = 1e-6;
const WIDTHS = [360, 768, 1400];
// The n = 4096 overview is "not blank" when the luminance of its drawn cells has a standard
// deviation of at least 10 levels of 255 (variance >= 100): a canvas of one colour has 0, and
// a colour scale whose cells differ by less than 4% of the range reads as a flat square.
const MIN_VARIANCE = 100;

const qkv = path.resolve(arg('--qkv', 'build/qkv'));
const work = path.resolve(arg('--work', fs.mkdtempSync(path.join(os.tmpdir(), 'qkv-browser-'))));
const screenshots = arg('--screenshots', null);
const only = arg('--only', null);
fs.rmSync(work, { recursive: true, force: true });
fs.mkdirSync(work, { recursive: true });
const run = runner(qkv, work);
const at = (name) => path.join(work, name);
const wanted = (name) => !only || only.split(',').includes(name);

// The terminal's sentences for one row that the page must say word for word: the
// parenthesised notes, step 4's heading, step 6's sum (before its values), line 7 and the
// no-key lines; step numbers ("4. ") dropped. The first walk-through of the output is used.
function terminalSentences(args, row) {
  const out = run(['explain', ...args, '--row', String(row)]);
  const lines = out.split('\n');
  const start = lines.findIndex((l) => l.startsWith('── query '));
  const end = lines.findIndex((l, n) => n > start && (l.startsWith('── query ') || l.trim() === ''));
  return lines.slice(start + 1, end < 0 ? undefined : end)
    .map((l) => l.trim())
    .filter((l) => /^\(|^4\. weights|^6\. O_|^7\. |no key is allowed/.test(l))
    .map((l) => l.replace(/^\d\. /, '').replace(/ = \[.*\]$/, '').replace(/\s+/g, ' '));
}
// Line 7 alone ("entropy ... of N allowed"), the one sentence #row .entropy holds.
function terminalEntropy(args, row) {
  const out = run(['explain', ...args, '--row', String(row)]);
  const line = out.split('\n').find((l) => /^7\. /.test(l));
  return line ? line.slice(3).replace(/\s+/g, ' ').trim() : null;
}
async function expectSameSentences(page, args, row, label) {
  const sentences = terminalSentences(args, row);
  // Compared without whitespace: a sentence split over table cells loses its spaces in
  // textContent, and its words must still all be there in order.
  const bare = (t) => t.replace(/\s+/g, '');
  const shown = bare(await page.textContent('#row'));
  const missing = sentences.filter((t) => !shown.includes(bare(t)));
  check(sentences.length >= 3 && missing.length === 0, label + ': the walk-through says the terminal\'s ' +
    sentences.length + ' sentences' + (missing.length ? ' (missing: "' + missing.slice(0, 2).join('", "') + '")' : ''));
}
const squash = (text) => (text || '').replace(/\s+/g, ' ').trim();

async function noOverflow(page, label) {
  for (const width of WIDTHS) {
    await page.setViewportSize({ width, height: 900 });
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
    const [scroll, inner] = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
    check(scroll <= inner, label + ': no horizontal overflow at ' + width + ' px (scrollWidth ' + scroll + ')');
  }
  await page.setViewportSize({ width: 1280, height: 900 });
  // The page redraws its maps 150 ms after the last resize (debounced): let that happen now,
  // not under a later check's locator (CI saw a zoomed cell detached by it).
  await page.waitForTimeout(400);
}

// A masked cell's colour in the exact view: its computed fill and its pixel on screen.
async function expectMaskedCellColour(page, label) {
  const want = hexColour(await page.evaluate(() => document.body.dataset.maskedColour));
  check(want !== null, label + ': body.dataset.maskedColour is #rrggbb');
  const cell = page.locator('#heatmap svg rect.cell.masked').first();
  if (!want || await cell.count() === 0) return check(false, label + ': a masked cell is drawn (rect.cell.masked)');
  await cell.scrollIntoViewIfNeeded();
  const pixel = await pixelAtCentre(page, cell);
  check(colourDistance(pixel, want) <= 1, label + ': a masked cell\'s pixel is the masked colour (' + pixel + ' vs ' + want + ')');
}

async function builtinChecks(page) {
  const part0 = builtinAttention(0);
  check(await page.locator('#row[data-row]').count() === 1, 'built-in: a walk-through is open on load, without a click');
  check(await page.locator('#story').count() === 1 && squash(await page.textContent('#story')).length > 40,
    'built-in: the story is shown (#story)');
  const headers = (await page.$$eval('.vec th', (ths) => ths.map((t) => t.textContent.trim().toLowerCase())));
  check(GENRES.every((g) => headers.includes(g)), 'built-in: vector columns are labelled with the genres (' + GENRES + ')');
  check(GIVES.every((g) => headers.includes(g)), 'built-in: value columns are labelled with what films give (' + GIVES + ')');
  const kvRows = squash(await page.textContent('table#kv-rows').catch(() => ''));
  check(FILMS.every((f) => kvRows.includes(f)), 'built-in: table#kv-rows lists all 6 films');
  const legend = page.locator('#heatmap-legend.legend[role="img"]');
  check(await legend.count() === 1 && (await legend.getAttribute('aria-label') || '').length > 0,
    'built-in: #heatmap-legend is an image with an aria-label');
  check(await page.locator('#heatmap[role][aria-label][tabindex="0"]').count() === 1,
    'built-in: #heatmap has a role, an aria-label and tabindex 0');
  check(await page.locator('#heatmap rect.cell').count() === 4 * 6, 'built-in: the heatmap has 4 x 6 cells (users x films)');

  await page.hover('#heatmap rect.cell[data-i="1"][data-j="2"]');
  const tip = await page.textContent('#tip');
  // The tip's numbers, each within half a unit of its last printed decimal of w(Ben, Notting Hill).
  const w12 = part0.w[1][2];
  const near = (tip.match(/-?\d+\.\d{2,}/g) || []).some((x) =>
    Math.abs(Number(x) - w12) <= 0.5 * 10 ** -(x.split('.')[1].length) + 1e-12);
  check(tip.includes('Ben') && tip.includes('Notting Hill') && near,
    'built-in: hovering (Ben, Notting Hill) names both and the weight ' + w12.toFixed(4) + ' ("' + squash(tip) + '")');

  // Each user's row against the float64 worked example; the stacked sum rebuilds O_i.
  let worst = 0, worstSum = 0, worstTitles = 0, terms = true, dataAttributes = true;
  for (let i = 0; i < USERS.length; ++i) {
    await page.click('#heatmap rect.cell[data-i="' + i + '"][data-j="0"]');
    const r = compareRow(await rowWeights(page), part0.w[i], TOLERANCE);
    worst = Math.max(worst, r.worst);
    check((await page.textContent('#row h2')).includes(USERS[i]), 'built-in: the walk-through of row ' + i + ' names ' + USERS[i]);
    const sum = await page.$$eval('#stacked-sum g.term[data-j]', (gs) => gs.map((g) => ({
      data: { ...g.dataset },
      rects: Array.from(g.querySelectorAll('[data-value], [data-contribution], rect')).map((r) => ({
        data: { ...r.dataset }, title: r.querySelector('title')?.textContent || '' })),
    })));
    terms = terms && sum.length === FILMS.length;
    // Σ_j w_j·v_j of the drawn terms against O_i worked out here: from data attributes (a term's
    // data-weight, each coordinate's data-value = w_j·v_jc) when the page has them, else from
    // the titles' printed contributions ("Alien (w = 0.3509): 0.3930": 4 decimals, so six
    // terms may be off by 6 x 5e-5).
    const o = [0, 0, 0], fromTitles = [0, 0, 0];
    let attributes = true;
    for (const t of sum) {
      const coords = t.rects.filter((r) => r.data.value !== undefined || r.data.contribution !== undefined);
      attributes = attributes && t.data.weight !== undefined && coords.length === 3;
      coords.forEach((r, c) => { o[c] += Number(r.data.value ?? r.data.contribution); });
      t.rects.slice(0, 3).forEach((r, c) => { fromTitles[c] += Number((r.title.match(/:\s*(-?[\d.]+)\s*$/) || [])[1]); });
    }
    dataAttributes = dataAttributes && attributes;
    const diff = (x, c) => (Number.isFinite(x) ? Math.abs(x - part0.o[i][c]) : Infinity);
    if (attributes) worstSum = Math.max(worstSum, ...o.map(diff));
    worstTitles = Math.max(worstTitles, ...fromTitles.map(diff));
  }
  check(worst <= TOLERANCE, 'built-in: every user\'s row equals the worked example (max diff ' + worst.toExponential(2) + ')');
  check(terms, 'built-in: #stacked-sum has one g.term per film');
  check(dataAttributes && worstSum <= TOLERANCE, (dataAttributes ? 'built-in: #stacked-sum data attributes add up to O_i (max diff ' + worstSum.toExponential(2) + ')'
    : 'built-in: #stacked-sum g.term carries data-weight, and each coordinate rect data-value = w_j·v_jc (missing)'));
  check(worstTitles <= 6 * 5e-5 + 1e-9, 'built-in: #stacked-sum terms as drawn (titles, 4 decimals) add up to O_i (max diff ' + worstTitles.toExponential(2) + ')');

  // The page says the terminal's entropy sentence for the same row.
  const sentence = terminalEntropy([], 1);
  await page.click('#heatmap rect.cell[data-i="1"][data-j="0"]');
  await expectSameSentences(page, [], 1, 'built-in');
  const shown = squash(await page.textContent('#row .entropy').catch(() => ''));
  check(sentence !== null && shown === sentence, 'built-in: #row .entropy says the terminal\'s line 7 ("' + shown + '" vs "' + sentence + '")');

  // The keyboard: arrows move the cursor, Enter opens its row, the status names the cell.
  await page.focus('#heatmap');
  await page.keyboard.press('ArrowDown');
  await page.keyboard.press('ArrowDown');
  await page.keyboard.press('ArrowRight');
  const cursor = await page.getAttribute('#heatmap', 'data-cursor');
  await page.keyboard.press('Enter');
  const [ci, cj] = String(cursor).split(',').map(Number);
  check(/^\d+,\d+$/.test(String(cursor)) && await page.getAttribute('#row', 'data-row') === String(ci),
    'built-in: arrows then Enter open the cursor\'s row (cursor ' + cursor + ')');
  const status = squash(await page.textContent('#heatmap-status').catch(() => ''));
  check(ci >= 0 && ci < 4 && cj >= 0 && cj < 6 && status.includes(USERS[ci]) && status.includes(FILMS[cj]),
    'built-in: #heatmap-status announces the cell ("' + status + '")');
  // The cursor stops at the map's edges.
  await page.focus('#heatmap');
  for (let n = 0; n < 10; ++n) await page.keyboard.press('ArrowUp');
  for (let n = 0; n < 10; ++n) await page.keyboard.press('ArrowRight');
  check(await page.getAttribute('#heatmap', 'data-cursor') === '0,5', 'built-in: the cursor stops at the top right cell (0,5)');
  check(await page.locator('#heatmap-status[aria-live], #heatmap-status[role="status"]').count() === 1,
    'built-in: #heatmap-status is a live region');

  // Part 1 is cross-attention: no distance column; part 2, the films, has 6 x 6 cells.
  check(!/distance/i.test(await page.textContent('#summary')), 'built-in part 1 (cross-attention): no distance column');
  check(await page.locator('#batch').isHidden(), 'built-in: #batch is hidden (one batch element)');
  await page.selectOption('#part', '1');
  check(await page.locator('#heatmap rect.cell').count() === 6 * 6, 'built-in: part 2 has 6 x 6 cells');
  const part1 = builtinAttention(1);
  await page.click('#heatmap rect.cell[data-i="4"][data-j="0"]');
  const r = compareRow(await rowWeights(page), part1.w[4], TOLERANCE);
  check(r.worst <= TOLERANCE, 'built-in part 2: The Matrix\'s row equals the worked example ' + r.why);
  await page.selectOption('#part', '0');
}

async function main() {
  const chromium = await loadChromium();
  // The built-in example.
  const builtin = at('builtin.html');
  run(['explain', '--html', builtin]);
  // Q, K, V files: two query heads sharing one kv head, causal, and a bool mask.
  const [h, nq, nk, d, dv] = [2, 40, 48, 16, 8];
  writeNpy(at('q.npy'), [h, nq, d], randomValues(h * nq * d, 1, 2));
  writeNpy(at('k.npy'), [1, nk, d], randomValues(nk * d, 2, 2));
  writeNpy(at('v.npy'), [1, nk, dv], randomValues(nk * dv, 3));
  writeNpy(at('mask.npy'), [nq, nk], randomValues(nq * nk, 4).map((x) => x > -0.6), '|b1');
  const files = ['--q', 'q.npy', '--k', 'k.npy', '--v', 'v.npy', '--causal', '--mask', 'mask.npy'];
  const masked = at('masked.html');
  run(['explain', ...files, '--html', masked]);
  run(['explain', ...files, '--quiet', '--svg', at('masked.svg')]);
  const head1 = at('head1.html');
  run(['explain', ...files, '--head', '1', '--html', head1]);
  const head1row = at('head1row.html');
  run(['explain', ...files, '--quiet', '--head', '1', '--row', '17', '--html', head1row]);
  run(['attention', ...files, '--kernel', 'reference', '--out-dtype', 'f64', '--out', 'o.npy', '--weights', 'w.npy']);
  const reference = readNpyF64(at('w.npy'));
  // A row with no allowed key (row 2 of a bool mask): the page says what the terminal says.
  writeNpy(at('q4.npy'), [6, 4], randomValues(24, 31));
  writeNpy(at('k4.npy'), [6, 4], randomValues(24, 32));
  writeNpy(at('v4.npy'), [6, 3], randomValues(18, 33));
  writeNpy(at('mask4.npy'), [6, 6], Array.from({ length: 36 }, (_, e) => Math.floor(e / 6) !== 2), '|b1');
  const noKeyFiles = ['--q', 'q4.npy', '--k', 'k4.npy', '--v', 'v4.npy', '--mask', 'mask4.npy'];
  const noKey = at('nokey.html');
  run(['explain', ...noKeyFiles, '--html', noKey]);
  // A sink (a logit of 1 with no value) on a causal input of 8: row 0 has one key.
  writeNpy(at('q5.npy'), [8, 4], randomValues(32, 41));
  writeNpy(at('k5.npy'), [8, 4], randomValues(32, 42));
  writeNpy(at('v5.npy'), [8, 3], randomValues(24, 43));
  writeNpy(at('s5.npy'), [1], [1.0]);
  const sinkFiles = ['--q', 'q5.npy', '--k', 'k5.npy', '--v', 'v5.npy', '--causal', '--sinks', 's5.npy'];
  const sink = at('sink.html');
  run(['explain', ...sinkFiles, '--html', sink]);
  // A batch of 2 elements, 1 head, n = 12, causal.
  writeNpy(at('qb.npy'), [2, 1, 12, 4], randomValues(96, 11, 2));
  writeNpy(at('kb.npy'), [2, 1, 12, 4], randomValues(96, 12, 2));
  writeNpy(at('vb.npy'), [2, 1, 12, 3], randomValues(72, 13));
  const batchFiles = ['--q', 'qb.npy', '--k', 'kb.npy', '--v', 'vb.npy', '--causal'];
  const batched = at('batched.html');
  run(['explain', ...batchFiles, '--html', batched]);
  const batched1 = at('batched1.html');
  run(['explain', ...batchFiles, '--quiet', '--batch', '1', '--row', '7', '--html', batched1]);
  run(['attention', ...batchFiles, '--kernel', 'reference', '--out-dtype', 'f64', '--out', 'ob.npy', '--weights', 'wb.npy']);
  const referenceB = readNpyF64(at('wb.npy'));
  // Cross-attention, layer form: X [5, 6] against a memory [9, 6].
  writeNpy(at('x.npy'), [5, 6], randomValues(30, 21));
  writeNpy(at('m.npy'), [9, 6], randomValues(54, 22));
  for (const [name, seed] of [['wq', 23], ['wk', 24], ['wv', 25]]) writeNpy(at(name + '.npy'), [6, 4], randomValues(24, seed));
  const cross = at('cross.html');
  run(['explain', '--x', 'x.npy', '--memory', 'm.npy', '--wq', 'wq.npy', '--wk', 'wk.npy', '--wv', 'wv.npy',
    '--heads', '2', '--html', cross]);
  // Parity with `qkv layer`: a fused W^Q|W^K|W^V stored [out, in] (--linear-layout) with its
  // fused bias, 2 heads of d_k = 3, causal; the page's O_i (its stacked sum's data-value
  // segments, added up) against the layer's --out in float64.
  writeNpy(at('xp.npy'), [6, 8], randomValues(48, 61));
  writeNpy(at('wqkvT.npy'), [18, 8], randomValues(144, 62));
  writeNpy(at('bqkv.npy'), [18], randomValues(18, 63));
  const parityFlags = ['--x', 'xp.npy', '--wqkv', 'wqkvT.npy', '--bqkv', 'bqkv.npy', '--linear-layout', '--heads', '2', '--causal'];
  const parity = at('parity.html');
  run(['explain', '--quiet', ...parityFlags, '--html', parity]);
  run(['layer', ...parityFlags, '--out-dtype', 'f64', '--out', 'ol.npy']);
  const layerOut = readNpyF64(at('ol.npy'));
  // n = 1024 with a window: the overview is pooled, a click zooms into exact cells.
  const n = 1024;
  writeNpy(at('q2.npy'), [n, d], randomValues(n * d, 5, 2));
  writeNpy(at('k2.npy'), [n, d], randomValues(n * d, 6, 2));
  writeNpy(at('v2.npy'), [n, dv], randomValues(n * dv, 7));
  const long = ['--q', 'q2.npy', '--k', 'k2.npy', '--v', 'v2.npy', '--window', '200,0'];
  const pooled = at('pooled.html');
  run(['explain', ...long, '--html', pooled]);
  run(['attention', ...long, '--kernel', 'reference', '--out-dtype', 'f64', '--out', 'o2.npy', '--weights', 'w2.npy']);
  const reference2 = readNpyF64(at('w2.npy'));
  // n = 2048 with a float mask (a third of it -inf): too large to embed, so the page holds
  // sampled rows; each must still equal the reference.
  const ns = 2048;
  writeNpy(at('qs.npy'), [ns, d], randomValues(ns * d, 51, 2));
  writeNpy(at('ks.npy'), [ns, d], randomValues(ns * d, 52, 2));
  writeNpy(at('vs.npy'), [ns, dv], randomValues(ns * dv, 53));
  const coin = randomValues(ns * ns, 55);
  writeNpy(at('fmask.npy'), [ns, ns], randomValues(ns * ns, 54).map((x, e) => (coin[e] < -0.33 ? -Infinity : x)));
  const sampledFiles = ['--q', 'qs.npy', '--k', 'ks.npy', '--v', 'vs.npy', '--mask', 'fmask.npy'];
  const sampled = at('sampled.html');
  run(['explain', '--quiet', ...sampledFiles, '--html', sampled]);
  run(['attention', ...sampledFiles, '--kernel', 'reference', '--out-dtype', 'f64', '--out', 'os.npy', '--weights', 'ws.npy']);
  const referenceS = readNpyF64(at('ws.npy'));
  // n = 4096: random, and causal.
  const big = 4096;
  writeNpy(at('q3.npy'), [big, d], randomValues(big * d, 8, 2));
  writeNpy(at('k3.npy'), [big, d], randomValues(big * d, 9, 2));
  writeNpy(at('v3.npy'), [big, dv], randomValues(big * dv, 10));
  const bigFiles = ['--q', 'q3.npy', '--k', 'k3.npy', '--v', 'v3.npy'];
  const large = at('large.html');
  const largeCausal = at('large-causal.html');
  run(['explain', ...bigFiles, '--html', large]);
  run(['explain', ...bigFiles, '--causal', '--html', largeCausal]);

  const browser = await launch(chromium);
  const { context } = browser;
  try {
    if (wanted('builtin')) {
      await withPage(context, builtin, async (page) => {
        await builtinChecks(page);
        await noOverflow(page, 'built-in');
        const png = await page.screenshot({ fullPage: true });
        const share = drawnShare(await decodePng(page, png));
        check(share > 0.02, 'built-in: the screenshot is not blank (' + (100 * share).toFixed(1) + '% of pixels drawn)');
      });
    }

    if (wanted('masked')) {
      await withPage(context, masked, async (page) => {
        check(await page.locator('#heatmap rect.cell').count() === nq * nk, 'masked: the heatmap has 40 x 48 cells');
        check(await page.locator('#summary tr.head-row').count() === h, 'masked: one summary row per head');
        check(await page.locator('#mask-legend').count() === 1, 'masked: the mask has a legend (#mask-legend)');
        // Causal with 8 more keys than queries: (0, 47) is masked whatever the bool mask says.
        check(await page.locator('#heatmap rect.cell.masked[data-i="0"][data-j="47"]').count() === 1,
          'masked: cell (0, 47) is drawn as masked');
        await expectMaskedCellColour(page, 'masked');
        // The --svg export of head 0 draws the same cells masked, in the same colour: as many
        // masked cells as the reference has forbidden (weight 0) pairs, each filled with it.
        const colour = await page.evaluate(() => document.body.dataset.maskedColour);
        const svg = fs.readFileSync(at('masked.svg'), 'utf8');
        const maskedRects = svg.match(/<rect class="cell masked"[^>]*>/g) || [];
        const forbidden = Array.from(reference.values.slice(0, nq * nk)).filter((w) => w === 0).length;
        check(maskedRects.length === forbidden && maskedRects.every((r) => r.includes('fill="' + colour + '"')),
          'masked: the --svg export has ' + forbidden + ' masked cells in ' + colour + ' (' + maskedRects.length + ')');
        let worst = 0, why = '';
        for (const [head, row] of [[0, 0], [0, 17], [1, 5], [1, 39]]) {
          await page.selectOption('#head', String(head));
          await page.click('#heatmap rect.cell[data-i="' + row + '"][data-j="0"]');
          check(await page.getAttribute('#row', 'data-row') === String(row) && await page.getAttribute('#row', 'data-head') === String(head),
            'masked: clicking (' + row + ', 0) of head ' + head + ' opens that row');
          const want = Array.from(reference.values.slice((head * nq + row) * nk, (head * nq + row + 1) * nk));
          const r = compareRow(await rowWeights(page), want, TOLERANCE);
          if (r.worst > worst) { worst = r.worst; why = r.why; }
        }
        check(worst <= TOLERANCE, 'masked: clicked rows list the allowed keys with the reference weights (max diff ' + worst.toExponential(2) + ') ' + why);
        await page.selectOption('#head', '0');
        await page.click('#heatmap rect.cell[data-i="17"][data-j="0"]');
        const sentence = terminalEntropy(files.concat(['--head', '0']), 17);
        await expectSameSentences(page, files.concat(['--head', '0']), 17, 'masked');
        const shown = squash(await page.textContent('#row .entropy').catch(() => ''));
        check(sentence !== null && shown === sentence, 'masked: #row .entropy says the terminal\'s line 7 ("' + shown + '" vs "' + sentence + '")');
        await noOverflow(page, 'masked (40 x 48 exact cells)');
      });
    }

    if (wanted('masked')) {
      await withPage(context, noKey, async (page) => {
        await page.click('#heatmap rect.cell[data-i="2"][data-j="0"]');
        check(await page.locator('#row-all tr[data-j]').count() === 0, 'no-key row: no key is listed');
        const sentence = terminalEntropy(noKeyFiles, 2);
        await expectSameSentences(page, noKeyFiles, 2, 'no-key row');
        const shown = squash(await page.textContent('#row .entropy').catch(() => ''));
        check(sentence !== null && shown === sentence, 'no-key row: #row .entropy says the terminal\'s line 7 ("' + shown + '" vs "' + sentence + '")');
      });
    }

    if (wanted('masked')) {
      await withPage(context, sink, async (page) => {
        for (const row of [0, 3]) {
          await page.click('#heatmap rect.cell[data-i="' + row + '"][data-j="0"]');
          await expectSameSentences(page, sinkFiles, row, 'sink, row ' + row);
          // exp(H) <= A for any distribution over A keys (2 decimals printed).
          const m = /exp\(entropy\) = ([\d.]+) of (\d+) allowed/.exec(await page.textContent('#row .entropy').catch(() => ''));
          check(m !== null && Number(m[1]) <= Number(m[2]) + 0.005,
            'sink, row ' + row + ': no more effective keys than allowed ones (' + (m ? m[0] : 'no entropy line') + ')');
        }
      });
    }

    if (wanted('head')) {
      await withPage(context, head1, async (page) => {
        check(await page.inputValue('#head') === '1', '--head 1: the page opens head 1');
        check(await page.getAttribute('#row', 'data-head') === '1', '--head 1: the open walk-through is of head 1');
        const row = await page.getAttribute('#row', 'data-row');
        check(await page.locator('.row-highlight').count() >= 1 && await page.getAttribute('#heatmap', 'data-row') === row,
          '--head 1: the open row ' + row + ' is highlighted (.row-highlight, #heatmap[data-row])');
      });
    }

    if (wanted('head')) {
      await withPage(context, head1row, async (page) => {
        check(await page.inputValue('#head') === '1' && await page.getAttribute('#row', 'data-head') === '1' &&
          await page.getAttribute('#row', 'data-row') === '17' && await page.getAttribute('#heatmap', 'data-row') === '17',
          '--head 1 --row 17: the page opens row 17 of head 1, highlighted');
      });
    }

    if (wanted('batched')) {
      await withPage(context, batched1, async (page) => {
        check(await page.inputValue('#batch') === '1' && await page.getAttribute('#row', 'data-row') === '7',
          '--batch 1 --row 7: the page opens row 7 of batch element 1');
        const want = Array.from(referenceB.values.slice((12 + 7) * 12, (12 + 8) * 12));
        const r = compareRow(await rowWeights(page), want, TOLERANCE);
        check(r.worst <= TOLERANCE, '--batch 1 --row 7: the open row equals the reference ' + r.why);
      });

      await withPage(context, batched, async (page) => {
        check(await page.locator('#batch').isVisible() && await page.locator('#batch option').count() === 2,
          'batched: #batch offers the 2 batch elements');
        await page.selectOption('#batch', '1');
        await page.click('#heatmap rect.cell[data-i="7"][data-j="0"]');
        const want = Array.from(referenceB.values.slice((12 + 7) * 12, (12 + 8) * 12));
        const r = compareRow(await rowWeights(page), want, TOLERANCE);
        check(r.worst <= TOLERANCE, 'batched: row 7 of batch element 1 equals the reference ' + r.why);
      });
    }

    if (wanted('cross')) {
      await withPage(context, cross, async (page) => {
        check(!/distance/i.test(await page.textContent('#summary')), 'cross-attention: no distance column in #summary');
        check(!/distance/i.test(await page.textContent('#row').catch(() => '')), 'cross-attention: the walk-through reports no distance');
      });
    }

    if (wanted('parity')) {
      await withPage(context, parity, async (page) => {
        let worst = 0, rows = 0;
        for (const head of [0, 1]) {
          await page.selectOption('#head', String(head));
          for (let i = 0; i < 6; ++i) {
            await page.click('#heatmap rect.cell[data-i="' + i + '"][data-j="0"]');
            const o = await page.$$eval('#stacked-sum g.term rect[data-c][data-value]', (rs) => {
              const sum = [0, 0, 0];
              for (const r of rs) sum[Number(r.dataset.c)] += Number(r.dataset.value);
              return sum;
            });
            for (let c = 0; c < 3; ++c) worst = Math.max(worst, Math.abs(o[c] - layerOut.values[i * 6 + head * 3 + c]));
            rows += 1;
          }
        }
        check(rows === 12 && worst <= TOLERANCE, 'parity: the page\'s O_i (--wqkv, --bqkv, --linear-layout, 2 heads) equal qkv layer\'s --out (max diff ' + worst.toExponential(2) + ')');
      });
    }

    if (wanted('pooled')) {
      await withPage(context, pooled, async (page) => {
        // The keyboard works on the pooled map too: Enter opens the cursor's row.
        await page.focus('#heatmap');
        for (let k = 0; k < 3; ++k) await page.keyboard.press('ArrowDown');
        await page.keyboard.press('ArrowRight');
        const cursor = String(await page.getAttribute('#heatmap', 'data-cursor'));
        await page.keyboard.press('Enter');
        check(/^\d+,\d+$/.test(cursor) && await page.getAttribute('#row', 'data-row') === cursor.split(',')[0] &&
          squash(await page.textContent('#heatmap-status')).length > 0,
          'pooled: arrows then Enter open the cursor\'s row (cursor ' + cursor + ') and the status names the block');
        const canvas = page.locator('#heatmap canvas');
        check(await canvas.count() === 1 && await canvas.getAttribute('data-rows') === '512' &&
          await canvas.getAttribute('data-cols') === '512', 'pooled: the overview is 512 x 512 pooled cells');
        const box = await canvas.boundingBox();
        await page.mouse.click(box.x + box.width * 0.5, box.y + box.height * 0.5);
        check(await page.locator('#heatmap rect.cell').count() === 64 * 64, 'pooled: a click zooms into 64 x 64 exact cells');
        const first = page.locator('#heatmap rect.cell').first();
        const row = Number(await first.getAttribute('data-i'));
        await first.click();
        const r = compareRow(await rowWeights(page), Array.from(reference2.values.slice(row * n, (row + 1) * n)), TOLERANCE);
        check(r.worst <= TOLERANCE, 'pooled: the zoomed row ' + row + ' equals the reference ' + r.why);
      });
    }

    if (wanted('sampled')) {
      await withPage(context, sampled, async (page) => {
        check(await page.evaluate(() => document.body.dataset.rowsMode) === 'sampled', 'sampled: a 2048 x 2048 float mask makes a sampled page');
        const box = await page.locator('#heatmap canvas').boundingBox();
        let worst = 0, why = '', opened = new Set();
        for (const [fx, fy] of [[0.2, 0.1], [0.5, 0.5], [0.8, 0.93]]) {
          await page.mouse.click(box.x + box.width * fx, box.y + box.height * fy);
          await page.waitForTimeout(100);
          const row = Number(await page.getAttribute('#row', 'data-row'));
          opened.add(row);
          // A sampled row lists its heaviest keys and says how many of how many allowed.
          const want = Array.from(referenceS.values.slice(row * ns, (row + 1) * ns));
          const listed = await rowWeights(page);
          const r = compareRow(listed, want, TOLERANCE, true);
          if (r.worst > worst) { worst = r.worst; why = 'row ' + row + ': ' + r.why; }
          const allowed = want.filter((w) => w > 0).length;
          const summary = squash(await page.textContent('#row-all-details summary').catch(() => ''));
          if (!summary.includes(String(listed.length)) || !summary.includes(String(allowed))) {
            worst = Infinity; why = 'row ' + row + ': the list is headed "' + summary + '", not ' + listed.length + ' of ' + allowed;
          }
        }
        check(opened.size === 3 && worst <= TOLERANCE, 'sampled: the rows opened from the map (' + [...opened] + ') list their heaviest keys with the reference weights ' +
          (worst <= TOLERANCE ? '' : why));
        await expectSameSentences(page, sampledFiles, [...opened].pop(), 'sampled');
      });
    }

    if (wanted('large')) {
      for (const [file, label, causal] of [[large, 'n = 4096 random', false], [largeCausal, 'n = 4096 causal', true]]) {
        await withPage(context, file, async (page) => {
          const variance = async (what) => {
            // Cell centres only, and for causal only cells wholly below the diagonal: the masked
            // half alone would make a blank map look varied.
            const values = await canvasCellLuminances(page, '#heatmap canvas', 3, causal);
            const mean = values.reduce((a, b) => a + b, 0) / values.length;
            const v = values.reduce((a, b) => a + (b - mean) ** 2, 0) / values.length;
            check(v >= MIN_VARIANCE, label + ', ' + what + ': the overview is not blank (luminance variance ' + v.toFixed(0) + ' >= ' + MIN_VARIANCE + ')');
            return v;
          };
          check(await page.inputValue('#scale') === 'row', label + ': the default scale is per row');
          await variance('scale per row');
          // The global scale: meaningful for causal, where row 0 has one key (weight 1) and the
          // last row 4096 (weights ~1/4096), so the map must show that gradient in log colour.
          // For random inputs every row's weights are near 1/4096 and a global map is rightly
          // near-uniform: its variance is printed, not checked.
          await page.selectOption('#scale', 'global');
          await page.selectOption('#colour', 'log');
          if (causal) {
            await variance('global scale, log colour');
          } else {
            const stats = await canvasStats(page, '#heatmap canvas');
            console.log('info  ' + label + ', global scale, log colour: luminance variance ' + stats.variance.toFixed(0));
          }
          await page.selectOption('#colour', 'linear');
          const stats = await canvasStats(page, '#heatmap canvas');
          console.log('info  ' + label + ', global scale, linear colour: luminance variance ' + stats.variance.toFixed(0));
          await page.selectOption('#scale', 'row');
          if (causal) {
            const want = hexColour(await page.evaluate(() => document.body.dataset.maskedColour));
            const pixel = await canvasCellPixel(page, '#heatmap canvas', 0, 511);
            check(want !== null && colourDistance(pixel, want) <= 1,
              label + ': the fully masked pooled cell (0, 511) has the masked colour (' + pixel + ' vs ' + want + ')');
            // Mean pooling: a different map, still not blank, masked blocks still masked.
            const maxMap = await canvasCellLuminances(page, '#heatmap canvas', 16, false);
            await page.selectOption('#pooling', 'mean');
            const meanMap = await canvasCellLuminances(page, '#heatmap canvas', 16, false);
            check(meanMap.some((y, n) => Math.abs(y - maxMap[n]) > 1), label + ': mean pooling draws another map than max pooling');
            await variance('mean pooling');
            const meanPixel = await canvasCellPixel(page, '#heatmap canvas', 0, 511);
            check(want !== null && colourDistance(meanPixel, want) <= 1, label + ', mean pooling: cell (0, 511) has the masked colour');
            await page.selectOption('#pooling', 'max');
            await noOverflow(page, label);
            // Zoomed into the top right (all masked): the exact cells have the same colour.
            const box = await page.locator('#heatmap canvas').boundingBox();
            await page.mouse.click(box.x + box.width * 0.97, box.y + box.height * 0.03);
            await expectMaskedCellColour(page, label + ', zoomed');
          }
        });
      }
    }

    if (screenshots) {
      fs.mkdirSync(screenshots, { recursive: true });
      for (const [file, name, width, height] of [[builtin, 'explain.png', 1400, 900], [builtin, 'explain-mobile.png', 360, 780], [largeCausal, 'explain-large.png', 1400, 900]]) {
        await withPage(context, file, async (page) => {
          // The built-in page at 1400 px: its top 1600 px (the story, the map and the open row).
          const clip = name === 'explain.png' ? { x: 0, y: 0, width, height: 1600 } : undefined;
          await page.screenshot({ path: path.join(screenshots, name), fullPage: Boolean(clip), clip });
          console.log('wrote ' + path.join(screenshots, name));
        }, { width, height });
      }
    }
  } finally {
    await browser.close();
  }
  const failures = failureCount();
  console.log(failures ? failures + ' check(s) failed' : 'all checks passed');
  process.exit(failures ? 1 : 0);
}

main().catch((e) => {
  console.error('browser test: ' + (e.stack || e));
  process.exit(1);
});
