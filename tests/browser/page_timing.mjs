// Times an explain page in headless Chromium: its size, load to interactive (body[data-ready]),
// a zoom, a row walk-through and a head switch, and the page's JS heap. A benchmark
// (bench_explain.sh runs it), not a test; it says whether the page is within the budget of
// issue 12 (at most 12 MB, interactive within 1.5 s) and exits 2 when it is not.
//   node page_timing.mjs PAGE.html [--budget-mb 12] [--budget-ms 1500]
import fs from 'node:fs';
import { arg, launch, loadChromium } from './lib.mjs';

const file = process.argv[2];
const budgetBytes = Number(arg('--budget-mb', '12')) * 1e6;
const budgetMs = Number(arg('--budget-ms', '1500'));
const bytes = fs.statSync(file).size;
const browser = await launch(await loadChromium());
const page = await browser.context.newPage();
const errors = [];
page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
page.on('pageerror', (e) => errors.push(e.message));
let t = performance.now();
await page.goto('file://' + file);
await page.waitForSelector('body[data-ready="1"]', { timeout: 120000, state: 'attached' });
const interactive = performance.now() - t;
const timings = { bytes, interactive_ms: Math.round(interactive) };
timings.rows_mode = await page.evaluate(() => document.body.dataset.rowsMode);
// A click on the pooled overview zooms into exact cells ('exact' pages) or opens the nearest
// sampled row ('sampled' pages, too long to hold every row).
const canvas = page.locator('#heatmap canvas');
if (await canvas.count() === 1) {
  const box = await canvas.boundingBox();
  const before = await page.getAttribute('#row', 'data-row').catch(() => null);
  t = performance.now();
  await page.mouse.click(box.x + box.width * 0.7, box.y + box.height * 0.3);
  if (timings.rows_mode === 'sampled') {
    await page.waitForFunction((b) => document.querySelector('#row')?.dataset.row !== b, before);
    timings.click_row_ms = Math.round(performance.now() - t);
  } else {
    await page.waitForSelector('#heatmap rect.cell', { state: 'attached' });
    timings.zoom_ms = Math.round(performance.now() - t);
  }
}
if (await page.locator('#heatmap rect.cell').count() > 100) {
  t = performance.now();
  await page.locator('#heatmap rect.cell').nth(100).click();
  await page.waitForSelector('#row-all tr[data-j]', { state: 'attached' });
  timings.row_ms = Math.round(performance.now() - t);
}
if (await page.locator('#head option').count() > 2) {
  t = performance.now();
  await page.selectOption('#head', '2');
  await page.waitForSelector('body[data-ready="1"]', { state: 'attached' });
  timings.head_switch_ms = Math.round(performance.now() - t);
}
const heap = await page.evaluate(() => (performance.memory ? performance.memory.usedJSHeapSize : -1));
timings.js_heap_mb = Math.round(heap / 1048576);
await browser.close();
const within = bytes <= budgetBytes && interactive <= budgetMs;
console.log(JSON.stringify(timings));
console.log('page ' + (bytes / 1e6).toFixed(2) + ' MB (budget ' + budgetBytes / 1e6 + ' MB), interactive in ' +
  Math.round(interactive) + ' ms (budget ' + budgetMs + ' ms): ' + (within ? 'within budget' : 'OVER BUDGET') +
  (errors.length ? '; errors: ' + errors.slice(0, 3).join('; ') : ''));
process.exit(errors.length ? 1 : within ? 0 : 2);
