// The explain page's style and script. The script reads the data block the C++ side embeds
// (see html_page.cc) and recomputes any row or zoomed block exactly from Q, K and the lse that
// attention() returned: w_ij = exp(scale·q_i·k_j + bias_ij - lse_i). The overview map itself is
// max-pooled in C++, so the page never holds n x n numbers for n in the thousands.
#include "explain/page_script.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace qkv::explain_detail {
namespace {

// White to deep blue: zero weight disappears into the page, the heaviest cells stand out.
constexpr double kRamp[5][3] = {
    {255, 255, 255}, {198, 219, 239}, {107, 174, 214}, {33, 113, 181}, {8, 48, 107}};

}  // namespace

void weight_colour(double fraction, char (&hex)[8]) noexcept {
  const double t = std::clamp(std::isfinite(fraction) ? fraction : 0.0, 0.0, 1.0) * 4.0;
  const int lo = std::min(static_cast<int>(t), 3);
  const double f = t - lo;
  int rgb[3];
  for (int c = 0; c < 3; ++c) {
    rgb[c] = static_cast<int>(std::lround(kRamp[lo][c] + (kRamp[lo + 1][c] - kRamp[lo][c]) * f));
  }
  std::snprintf(hex, sizeof hex, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

const char* page_style() noexcept {
  return R"CSS(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d2433;
       background: #f6f7fb; }
header { background: #12325e; color: #fff; padding: 12px 20px; }
header h1 { font-size: 18px; margin: 0 0 4px; }
header p { margin: 0; opacity: .85; }
#part-facts { white-space: pre-line; }
main { display: grid; grid-template-columns: minmax(560px, 620px) 1fr; gap: 16px; padding: 16px 20px; }
section { background: #fff; border: 1px solid #dde2ec; border-radius: 6px; padding: 12px 14px; }
h2 { font-size: 15px; margin: 0 0 8px; }
.controls { display: flex; gap: 12px; align-items: center; flex-wrap: wrap; margin-bottom: 8px; }
.muted { color: #667085; font-size: 12px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 2px 8px; text-align: right; border-bottom: 1px solid #eef0f5; }
th { font-weight: 600; color: #44506a; }
td.label, th.label { text-align: left; }
#summary tr.head-row { cursor: pointer; }
#summary tr.selected { background: #e7efff; }
#heatmap { position: relative; min-height: 80px; }
#heatmap canvas { image-rendering: pixelated; border: 1px solid #ccd3e0; cursor: zoom-in; }
#heatmap svg rect.cell { cursor: pointer; }
#heatmap svg rect.cell:hover { stroke: #e4572e; stroke-width: 2; }
#mask canvas { image-rendering: pixelated; border: 1px solid #ccd3e0; }
#tip { position: fixed; pointer-events: none; background: #1d2433; color: #fff; padding: 6px 8px;
       border-radius: 4px; font-size: 12px; white-space: pre; display: none; z-index: 10; }
.bar { display: inline-block; height: 11px; background: #2171b5; vertical-align: middle; }
.vec { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
ol.steps > li { margin-bottom: 10px; }
details { margin-top: 8px; }
button { font: inherit; }
)CSS";
}

const char* page_script() noexcept {
  return R"JS(
'use strict';
const DATA = JSON.parse(document.getElementById('qkv-data').textContent);
const EXACT_CELLS = 64;  // views up to 64 x 64 are drawn cell by cell, exactly
const $ = (id) => document.getElementById(id);
const state = { part: 0, head: 0, view: null, row: null };

function decode(text, Type) {
  const bin = atob(text);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; ++i) bytes[i] = bin.charCodeAt(i);
  return new Type(bytes.buffer);
}
// Arrays are decoded on first use and kept beside their text, so a large page costs only what
// is looked at.
function arr(holder, key, index, Type) {
  const slot = '$' + key + index;
  if (!holder[slot]) holder[slot] = decode(holder[key][index], Type);
  return holder[slot];
}
const part = () => DATA.parts[state.part];
const qlabel = (p, i) => (p.queryLabels ? p.queryLabels[i] : String(i));
const klabel = (p, j) => (p.keyLabels ? p.keyLabels[j] : String(j));
const kvOf = (p, h) => Math.floor(h / (p.heads / p.kvHeads));
const fmt = (x) => (x === -Infinity ? '-inf' : x === Infinity ? 'inf' : x.toFixed(4));
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c]));

// The library's allowed(i, j) rule (causal and window, bottom-right aligned) and the mask.
function bias(p, h, i, j) {
  const diag = i + p.nk - p.nq;
  if (p.causal && j > diag) return -Infinity;
  if (p.window) {
    if (p.window[0] >= 0 && j < diag - p.window[0]) return -Infinity;
    if (p.window[1] >= 0 && j > diag + p.window[1]) return -Infinity;
  }
  if (p.maskBias) return arr(p, 'maskBias', p.maskPerHead ? h : 0, Float64Array)[i * p.nk + j];
  return 0;
}
const computable = (p) => !p.maskTooLarge;
// The terminal's wording: the bound (1e-12, 1e-9, ...) the difference stays within.
function bound(diff) {
  let b = 1e-12;
  while (b < diff && b < 1) b *= 1e3;
  return b.toExponential(0);
}

function cell(p, h, i, j) {
  const q = arr(p, 'q', h, Float64Array), k = arr(p, 'k', kvOf(p, h), Float64Array);
  const lse = arr(p, 'lse', h, Float64Array)[i];
  let dot = 0;
  for (let c = 0; c < p.d; ++c) dot += q[i * p.d + c] * k[j * p.d + c];
  // s = softcap(scale·r) + ALiBi + bias, as the library computes it.
  const b = bias(p, h, i, j);
  let score = -Infinity;
  if (b !== -Infinity) {
    const scaled = p.scale * dot;
    score = (p.softcap > 0 ? p.softcap * Math.tanh(scaled / p.softcap) : scaled) + b;
    if (p.alibi) score -= p.alibi[h] * Math.abs(i + p.nk - p.nq - j);
  }
  const weight = isFinite(score) && isFinite(lse) ? Math.exp(score - lse) : 0;
  return { raw: dot, score, weight, lse };
}

// ---- colours (the same ramp as the SVG export) ----
const RAMP = [[255, 255, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
function colour(f) {
  const t = Math.min(Math.max(isFinite(f) ? f : 0, 0), 1) * 4;
  const lo = Math.min(Math.floor(t), 3), u = t - lo;
  return RAMP[lo].map((c, n) => Math.round(c + (RAMP[lo + 1][n] - c) * u));
}
const css = (rgb) => 'rgb(' + rgb.join(',') + ')';

// ---- tooltip ----
function tip(ev, text) {
  const t = $('tip');
  if (!text) { t.style.display = 'none'; return; }
  t.textContent = text;
  t.style.display = 'block';
  t.style.left = ev.clientX + 14 + 'px';
  t.style.top = ev.clientY + 14 + 'px';
}

// ---- heatmap ----
function renderHeatmap() {
  const p = part(), h = state.head, box = $('heatmap');
  box.innerHTML = '';
  const small = p.nq <= EXACT_CELLS && p.nk <= EXACT_CELLS;
  if (state.view || (small && computable(p))) {
    const v = state.view || { r0: 0, c0: 0, rows: p.nq, cols: p.nk };
    box.appendChild(exactSvg(p, h, v));
    $('view-note').textContent = state.view
      ? 'Zoomed: queries ' + v.r0 + '–' + (v.r0 + v.rows - 1) + ', keys ' + v.c0 + '–' + (v.c0 + v.cols - 1) +
        ', every cell exact. Click a cell for its row.'
      : 'Every (query, key) cell. Hover for numbers, click for the row\'s walk-through.';
  } else {
    box.appendChild(pooledCanvas(p, h));
    $('view-note').textContent = 'Max-pooled to ' + p.scans[h].mapRows + ' x ' + p.scans[h].mapCols +
      ' cells (each shows the largest weight in its block). Click to zoom into a block.';
  }
  $('back').style.display = state.view ? '' : 'none';
}

function exactSvg(p, h, v) {
  const NS = 'http://www.w3.org/2000/svg';
  const size = Math.max(4, Math.min(40, Math.floor(512 / Math.max(v.rows, v.cols))));
  const labelled = v.rows <= 40 && v.cols <= 40;
  const left = labelled ? 110 : 8, top = labelled ? 90 : 8;
  const svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('width', left + v.cols * size + 8);
  svg.setAttribute('height', top + v.rows * size + 8);
  svg.setAttribute('data-rows', v.rows);
  svg.setAttribute('data-cols', v.cols);
  const weights = [];
  let max = 0;
  for (let r = 0; r < v.rows; ++r) {
    for (let c = 0; c < v.cols; ++c) {
      const x = cell(p, h, v.r0 + r, v.c0 + c);
      weights.push(x);
      max = Math.max(max, x.weight);
    }
  }
  for (let r = 0; r < v.rows; ++r) {
    for (let c = 0; c < v.cols; ++c) {
      const x = weights[r * v.cols + c], i = v.r0 + r, j = v.c0 + c;
      const rect = document.createElementNS(NS, 'rect');
      rect.setAttribute('class', 'cell');
      rect.setAttribute('x', left + c * size);
      rect.setAttribute('y', top + r * size);
      rect.setAttribute('width', size);
      rect.setAttribute('height', size);
      rect.setAttribute('fill', isFinite(x.score) ? css(colour(max > 0 ? x.weight / max : 0)) : '#e9ebf0');
      rect.dataset.i = i;
      rect.dataset.j = j;
      svg.appendChild(rect);
    }
  }
  if (labelled) {
    const text = (x, y, s, anchor, rotate) => {
      const t = document.createElementNS(NS, 'text');
      t.setAttribute('x', x); t.setAttribute('y', y);
      t.setAttribute('font-size', 11); t.setAttribute('text-anchor', anchor);
      if (rotate) t.setAttribute('transform', 'rotate(-45 ' + x + ' ' + y + ')');
      t.textContent = s;
      svg.appendChild(t);
    };
    for (let r = 0; r < v.rows; ++r) text(left - 4, top + r * size + size / 2 + 4, qlabel(p, v.r0 + r), 'end', false);
    for (let c = 0; c < v.cols; ++c) text(left + c * size + size / 2, top - 4, klabel(p, v.c0 + c), 'start', true);
  }
  svg.addEventListener('mousemove', (ev) => {
    const d = ev.target.dataset;
    if (d.i === undefined) { tip(ev, null); return; }
    const i = +d.i, j = +d.j, x = cell(p, h, i, j);
    tip(ev, 'query ' + i + ' (' + qlabel(p, i) + ') → key ' + j + ' (' + klabel(p, j) + ')\n' +
      'score s = ' + fmt(x.score) + '   (r = q·k = ' + fmt(x.raw) + ')\nweight w = ' + x.weight.toFixed(6));
  });
  svg.addEventListener('mouseleave', (ev) => tip(ev, null));
  svg.addEventListener('click', (ev) => {
    const d = ev.target.dataset;
    if (d.i !== undefined) showRow(+d.i, +d.j);
  });
  return svg;
}

function pooledCanvas(p, h) {
  const s = p.scans[h];
  const map = arr(s, 'maxWeight', 0, Float32Array);
  const canvas = document.createElement('canvas');
  canvas.width = s.mapCols;
  canvas.height = s.mapRows;
  canvas.style.width = '512px';
  canvas.style.height = Math.max(64, Math.round(512 * Math.min(2, s.mapRows / s.mapCols))) + 'px';
  canvas.dataset.rows = s.mapRows;
  canvas.dataset.cols = s.mapCols;
  let max = 0;
  for (const w of map) max = Math.max(max, w);
  const img = canvas.getContext('2d').createImageData(s.mapCols, s.mapRows);
  for (let n = 0; n < map.length; ++n) {
    const rgb = colour(max > 0 ? map[n] / max : 0);
    img.data.set([rgb[0], rgb[1], rgb[2], 255], n * 4);
  }
  canvas.getContext('2d').putImageData(img, 0, 0);
  const at = (ev) => {
    const b = canvas.getBoundingClientRect();
    const a = Math.min(s.mapRows - 1, Math.floor((ev.clientY - b.top) / b.height * s.mapRows));
    const c = Math.min(s.mapCols - 1, Math.floor((ev.clientX - b.left) / b.width * s.mapCols));
    const i0 = Math.ceil(a * p.nq / s.mapRows), i1 = Math.ceil((a + 1) * p.nq / s.mapRows) - 1;
    const j0 = Math.ceil(c * p.nk / s.mapCols), j1 = Math.ceil((c + 1) * p.nk / s.mapCols) - 1;
    return { a, c, i0, i1, j0, j1 };
  };
  canvas.addEventListener('mousemove', (ev) => {
    const x = at(ev);
    tip(ev, 'queries ' + x.i0 + '–' + x.i1 + ', keys ' + x.j0 + '–' + x.j1 +
      '\nlargest weight in block: ' + map[x.a * s.mapCols + x.c].toFixed(6));
  });
  canvas.addEventListener('mouseleave', (ev) => tip(ev, null));
  canvas.addEventListener('click', (ev) => {
    if (!computable(p)) return;
    const x = at(ev);
    zoomTo(Math.floor((x.i0 + x.i1) / 2), Math.floor((x.j0 + x.j1) / 2));
  });
  return canvas;
}

function zoomTo(i, j) {
  const p = part();
  const rows = Math.min(EXACT_CELLS, p.nq), cols = Math.min(EXACT_CELLS, p.nk);
  const r0 = Math.max(0, Math.min(p.nq - rows, i - (rows >> 1)));
  const c0 = Math.max(0, Math.min(p.nk - cols, j - (cols >> 1)));
  state.view = { r0, c0, rows, cols };
  renderHeatmap();
}

// ---- mask pattern (from the rule alone: no weights needed) ----
function renderMask() {
  const p = part(), s = p.scans[state.head], box = $('mask');
  box.innerHTML = '';
  if (!p.masked) { box.textContent = 'No mask: every query may attend to every key.'; return; }
  const share = arr(s, 'allowed', 0, Uint8Array);
  const canvas = document.createElement('canvas');
  canvas.width = s.mapCols; canvas.height = s.mapRows;
  canvas.style.width = '256px';
  canvas.style.height = Math.max(32, Math.round(256 * Math.min(2, s.mapRows / s.mapCols))) + 'px';
  const img = canvas.getContext('2d').createImageData(s.mapCols, s.mapRows);
  for (let n = 0; n < share.length; ++n) {
    const g = 235 - Math.round(share[n] * 200 / 255);
    img.data.set([g, g, g + 10 > 255 ? 255 : g + 10, 255], n * 4);
  }
  canvas.getContext('2d').putImageData(img, 0, 0);
  box.appendChild(canvas);
  const note = document.createElement('div');
  note.className = 'muted';
  note.textContent = 'Dark: query i may attend to key j (' + p.maskText + ').';
  box.appendChild(note);
}

// ---- head summaries ----
function renderSummary() {
  const p = part();
  let html = '<tr><th class="label">head</th><th>mean entropy</th><th>effective keys</th>' +
    '<th>mean distance</th><th>weight on key 0</th><th>mean max weight</th></tr>';
  p.scans.forEach((s, h) => {
    html += '<tr class="head-row' + (h === state.head ? ' selected' : '') + '" data-head="' + h + '">' +
      '<td class="label">' + h + '</td><td>' + s.meanEntropy.toFixed(3) + '</td><td>' +
      Math.exp(s.meanEntropy).toFixed(2) + '</td><td>' + s.meanDistance.toFixed(2) + '</td><td>' +
      s.meanFirstKey.toFixed(3) + '</td><td>' + s.meanMaxWeight.toFixed(3) + '</td></tr>';
  });
  $('summary').innerHTML = html;
  for (const tr of $('summary').querySelectorAll('tr.head-row')) {
    tr.addEventListener('click', () => selectHead(+tr.dataset.head));
  }
}

// ---- a row's walk-through: the terminal's steps, recomputed here ----
const vec = (a, n) => '[ ' + Array.from(a.slice(0, n || 12), (x) => x.toFixed(4)).join('  ') +
  (a.length > (n || 12) ? '  … ' + (a.length - (n || 12)) + ' more' : '') + ' ]';

function showRow(i, focus) {
  const p = part(), h = state.head, box = $('row');
  state.row = i;
  $('row-input').value = i;
  if (!computable(p)) {
    box.innerHTML = '<p>The explicit mask is too large to embed, so rows are not recomputed here: run ' +
      '<code>qkv explain --row ' + i + '</code> for this row.</p>';
    return;
  }
  const q = arr(p, 'q', h, Float64Array).slice(i * p.d, (i + 1) * p.d);
  const Values = p.valuesF64 ? Float64Array : Float32Array;
  const v = arr(p, 'v', kvOf(p, h), Values), out = arr(p, 'out', h, Values);
  const cells = [];
  for (let j = 0; j < p.nk; ++j) cells.push(cell(p, h, i, j));
  const lse = cells.length ? cells[0].lse : -Infinity;
  const order = cells.map((_, j) => j).sort((a, b) => cells[b].weight - cells[a].weight || a - b);
  let entropy = 0, allowed = 0;
  for (const c of cells) {
    if (c.weight > 0) entropy -= c.weight * Math.log(c.weight);
    if (isFinite(c.score)) ++allowed;
  }
  const top = Math.min(p.nk, p.nk <= 12 ? p.nk : 8);
  const sum = new Float64Array(p.dv);
  cells.forEach((c, j) => { for (let n = 0; n < p.dv; ++n) sum[n] += c.weight * v[j * p.dv + n]; });
  const o = out.slice(i * p.dv, (i + 1) * p.dv);
  let html = '<h2>Query ' + i + ' “' + esc(qlabel(p, i)) + '”' + (p.heads > 1 ? ', head ' + h : '') + '</h2><ol class="steps">';
  if (p.x) {
    const x = arr(p, 'x', 0, Float64Array).slice(i * p.dx, (i + 1) * p.dx);
    html += '<li>x<sub>' + i + '</sub> (row ' + i + ' of ' + esc(p.xName) + ') = <span class="vec">' + vec(x) +
      '</span><br>q<sub>' + i + '</sub> = x<sub>' + i + '</sub>·W<sup>Q</sup> = <span class="vec">' + vec(q) + '</span></li>';
  } else {
    html += '<li>q<sub>' + i + '</sub> (row ' + i + ' of Q) = <span class="vec">' + vec(q) + '</span></li>';
  }
  html += '<li>Raw relevance r<sub>' + i + 'j</sub> = q<sub>' + i + '</sub>·k<sub>j</sub> (how well each key matches the query)</li>' +
    '<li>Scores s<sub>' + i + 'j</sub> = ' +
    (p.softcap > 0 ? p.softcap.toPrecision(6) + '·tanh(' + p.scale.toPrecision(6) + '·r<sub>' + i + 'j</sub> / ' + p.softcap.toPrecision(6) + ') (soft-capped)'
                   : p.scale.toPrecision(6) + '·r<sub>' + i + 'j</sub>') +
    (p.alibi ? ' − ' + p.alibi[h].toPrecision(6) + '·|' + (i + p.nk - p.nq) + ' − j| (ALiBi)' : '') +
    (p.masked ? ' + mask (−inf: not allowed)' : '') +
    (p.sinks ? '; the sink (' + fmt(p.sinks[h]) + ', no value) takes ' + (isFinite(lse) ? Math.exp(p.sinks[h] - lse) : 0).toFixed(4) + ' of the denominator' : '') +
    ':<table><tr><th class="label">key</th><th>r</th><th>s</th></tr>';
  const shown = p.nk <= 12 ? cells.map((_, j) => j) : order.slice(0, top);
  for (const j of shown) {
    html += '<tr><td class="label">' + esc(klabel(p, j)) + '</td><td>' + fmt(cells[j].raw) + '</td><td>' + fmt(cells[j].score) + '</td></tr>';
  }
  html += '</table></li><li>Weights w = softmax(s) = exp(s − lse), lse = ' + fmt(lse) + '; heaviest first:<table id="row-bars">';
  let rest = 1;
  for (const j of order.slice(0, top)) {
    const w = cells[j].weight;
    rest -= w;
    html += '<tr data-j="' + j + '"' + (j === focus ? ' style="background:#fff4e5"' : '') + '><td class="label">' + esc(klabel(p, j)) +
      '</td><td>' + w.toFixed(4) + '</td><td class="label"><span class="bar" style="width:' +
      Math.round(200 * w / Math.max(cells[order[0]].weight, 1e-300)) + 'px"></span></td></tr>';
  }
  if (top < p.nk) html += '<tr><td class="label">(' + (p.nk - top) + ' more)</td><td>' + Math.max(rest, 0).toFixed(4) + '</td><td></td></tr>';
  html += '</table></li><li>Values of the heaviest keys (V: another transform of the same key rows):<br>';
  for (const j of order.slice(0, Math.min(3, top))) {
    html += '<span class="vec">' + esc(klabel(p, j)) + ': ' + cells[j].weight.toFixed(4) + ' × ' +
      vec(v.slice(j * p.dv, (j + 1) * p.dv)) + '</span><br>';
  }
  let diff = 0;
  for (let n = 0; n < p.dv; ++n) diff = Math.max(diff, Math.abs(o[n] - sum[n]));
  html += '</li><li>O<sub>' + i + '</sub> = Σ<sub>j</sub> w<sub>' + i + 'j</sub>·v<sub>j</sub> over all ' + p.nk +
    ' keys = <span class="vec">' + vec(o) + '</span><br><span class="muted">attention()\'s output; Σ<sub>j</sub> w<sub>' + i +
    'j</sub>·v<sub>j</sub> recomputed here agrees within ' + bound(diff) + '</span></li><li>Entropy ' + entropy.toFixed(4) + ' nats; effective number of keys exp(entropy) = ' +
    (isFinite(lse) ? Math.exp(entropy) : 0).toFixed(2) + ' of ' + allowed + ' allowed</li></ol>';
  const listed = Math.min(p.nk, 4096);
  html += '<details id="row-all-details"><summary>every key' + (listed < p.nk ? ' (first ' + listed + ')' : '') +
    '</summary><table id="row-all"><tr><th>j</th><th class="label">key</th><th>r</th><th>s</th><th>w</th></tr>';
  for (let j = 0; j < listed; ++j) {
    const c = cells[j];
    html += '<tr data-j="' + j + '" data-weight="' + c.weight.toPrecision(17) + '"><td>' + j + '</td><td class="label">' +
      esc(klabel(p, j)) + '</td><td>' + fmt(c.raw) + '</td><td>' + fmt(c.score) + '</td><td>' + c.weight.toFixed(6) + '</td></tr>';
  }
  box.innerHTML = html + '</table></details>';
  box.dataset.row = i;
  box.dataset.head = h;
}

// ---- controls ----
function selectHead(h) {
  state.head = h;
  $('head').value = h;
  renderSummary();
  renderHeatmap();
  renderMask();
  if (state.row !== null) showRow(state.row); else $('row').innerHTML = '<p class="muted">Click a cell (or pick a row below) to walk through that query.</p>';
}

function selectPart(n) {
  state.part = n;
  state.view = null;
  state.row = null;
  const p = part();
  $('part-title').textContent = p.title;
  $('part-facts').textContent = p.facts;
  const head = $('head');
  head.innerHTML = '';
  for (let h = 0; h < p.heads; ++h) head.add(new Option('head ' + h, h));
  $('row-input').max = p.nq - 1;
  selectHead(0);
}

function init() {
  const partSelect = $('part');
  DATA.parts.forEach((p, n) => partSelect.add(new Option((n + 1) + '. ' + p.short, n)));
  $('part-box').style.display = DATA.parts.length > 1 ? '' : 'none';
  partSelect.addEventListener('change', () => selectPart(+partSelect.value));
  $('head').addEventListener('change', () => selectHead(+$('head').value));
  $('back').addEventListener('click', () => { state.view = null; renderHeatmap(); });
  $('row-go').addEventListener('click', () => {
    const i = Math.max(0, Math.min(part().nq - 1, Math.floor(+$('row-input').value || 0)));
    if (part().nq > EXACT_CELLS || part().nk > EXACT_CELLS) zoomTo(i, i + part().nk - part().nq);
    showRow(i);
  });
  selectPart(0);
  document.body.dataset.ready = '1';
}
init();
)JS";
}

}  // namespace qkv::explain_detail
