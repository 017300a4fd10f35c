// Times an explain page in headless Chromium: load to ready, a zoom, a row walk-through and a
// head switch, and the page's JS heap. A benchmark (bench_explain.sh runs it), not a test.
//   node page_timing.mjs PAGE.html
import { chromium } from 'playwright-core';
import fs from 'node:fs';
const file = process.argv[2];
const profile = fs.mkdtempSync('/tmp/qkv-perf-');
const ctx = await chromium.launchPersistentContext(profile, { executablePath: '/usr/bin/chromium', headless: true,
  viewport: { width: 1280, height: 900 },
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run'] });
const page = await ctx.newPage();
const errors = [];
page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
page.on('pageerror', (e) => errors.push(e.message));
let t = Date.now();
await page.goto('file://' + file);
await page.waitForSelector('body[data-ready="1"]', { timeout: 120000 });
console.log('load to ready ms', Date.now() - t);
const mode = await page.evaluate(() => document.body.dataset.rowsMode);
console.log('rows mode', mode, 'page bytes', fs.statSync(file).size);
const canvas = page.locator('#heatmap canvas');
const box = await canvas.boundingBox();
if (mode === 'sampled') {
  // No zoom in the sampled mode: a click opens the nearest sampled row.
  t = Date.now();
  await page.mouse.click(box.x + box.width * 0.7, box.y + box.height * 0.3);
  await page.waitForSelector('#row[data-row]', { state: 'attached' });
  console.log('click to nearest sampled row ms', Date.now() - t, 'row', await page.getAttribute('#row', 'data-row'));
} else {
  t = Date.now();
  await page.mouse.click(box.x + box.width * 0.7, box.y + box.height * 0.3);
  await page.waitForSelector('#heatmap rect.cell');
  console.log('zoom ms', Date.now() - t, await page.locator('#heatmap rect.cell').count());
  t = Date.now();
  await page.locator('#heatmap rect.cell').nth(100).click();
  await page.waitForSelector('#row-all tr[data-j]', { state: 'attached' });
  console.log('row ms', Date.now() - t);
}
t = Date.now();
await page.selectOption('#head', '2');
console.log('head switch ms', Date.now() - t);
const mem = await page.evaluate(() => performance.memory ? performance.memory.usedJSHeapSize : -1);
console.log('js heap MB', (mem / 1048576).toFixed(0), 'errors', errors);
await ctx.close();
fs.rmSync(profile, { recursive: true, force: true });
if (errors.length) process.exit(1);
