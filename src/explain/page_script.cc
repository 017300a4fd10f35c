// The explain page's script, first piece: the data block, the terminal's wording rules, number
// formatting, colours and legends, axis ticks, and the controls. The other pieces (page_map.cc,
// page_row.cc, page_story.cc) draw the views; html_page() joins them into one <script>.
//
// The script reads the data block that page_data.cc writes. In the exact rows mode it
// recomputes any row or zoomed block from Q, K and the lse that attention() returned:
// w_ij = exp(s_ij - lse_i); in the sampled mode it shows the walk-throughs made in C++.
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

const char* page_script_core() noexcept {
  return R"JS(
'use strict';
const DATA = JSON.parse(document.getElementById('qkv-data').textContent);
const EXACT_CELLS = 64;  // views up to 64 x 64 are drawn cell by cell, exactly
const LOG_DECADES = 6;   // the log colour scale spans 1e-6 of the reference up to it
const $ = (id) => document.getElementById(id);
const NS = 'http://www.w3.org/2000/svg';
const state = { part: 0, head: 0, view: null, row: null, scale: null, colour: 'linear',
  pooling: 'max', cursor: null, geom: null };

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
  if (!holder[slot]) holder[slot] = decode(index === null ? holder[key] : holder[key][index], Type);
  return holder[slot];
}
const part = () => DATA.parts[state.part];
const exactRows = (p) => p.rowsMode === 'exact';
const rowType = (p) => (p.precision === 'f64' ? Float64Array : Float32Array);
const qlabel = (p, i) => (p.queryLabels ? p.queryLabels[i] : String(i));
const klabel = (p, j) => (p.keyLabels ? p.keyLabels[j] : String(j));
// Coordinate names: the given labels, or c0, c1, ... when the input names none.
const coord = (labels, c) => (labels && labels[c] !== undefined ? labels[c] : 'c' + c);
const kvOf = (p, h) => Math.floor(h / (p.heads / p.kvHeads));
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c]));

// explain_detail::fixed: printf's %.Nf, never "-0.0000", and inf / -inf / nan. toFixed rounds an
// exact tie away from zero where glibc's printf rounds it to even: the long exact expansion
// (toFixed is exact) finds true ties.
function fixed(x, digits = 4) {
  if (x === Infinity) return 'inf';
  if (x === -Infinity) return '-inf';
  if (Number.isNaN(x)) return 'nan';
  let s = x.toFixed(digits);
  const long = Math.abs(x).toFixed(Math.min(100, digits + 60)), dot = long.indexOf('.');
  if (/^50*$/.test(long.slice(dot + 1 + digits))) {
    const kept = digits ? long.slice(0, dot + 1 + digits) : long.slice(0, dot);
    if (+kept[kept.length - 1] % 2 === 0) s = (x < 0 ? '-' : '') + kept;
  }
  if (/^-[0.]*$/.test(s)) s = s.slice(1);
  return s;
}
const fmt = (x) => fixed(x, 4);
// printf's %.6g, as the terminal prints the scale, the softcap and ALiBi slopes.
function g6(x) {
  if (x === 0 || !isFinite(x)) return String(x);
  const [mantissa, exp] = x.toExponential(5).split('e');
  const e = +exp, trim = (t) => (t.includes('.') ? t.replace(/\.?0+$/, '') : t);
  if (e < -4 || e >= 6) return trim(mantissa) + 'e' + (e < 0 ? '-' : '+') + String(Math.abs(e)).padStart(2, '0');
  return trim(x.toFixed(5 - e));
}
// printf's %.0e: the bound the recomputed sum agrees within.
function bound(diff) {
  let b = 1e-12;
  while (b < diff && b < 1) b *= 1e3;
  return b.toExponential(0).replace(/e([+-])(\d)$/, 'e$10$2');
}
// "1 query", "2 queries".
const count = (n, one, many) => n + ' ' + (n === 1 ? one : many);

// The terminal's sentences (wording.cc): "{name}" is the value, "{name|one|many}" the value and
// the word that agrees with it (singular only when the value is exactly "1").
function say(id, values = {}) {
  const text = DATA.phrases[id];
  if (text === undefined) throw new Error('explain page: no phrase ' + id);
  return text.replace(/\{([^}|]*)(?:\|([^}|]*)\|([^}]*))?\}/g, (_, name, one, many) => {
    if (!(name in values)) throw new Error('explain page: phrase ' + id + ' needs {' + name + '}');
    const v = String(values[name]);
    return one === undefined ? v : v + ' ' + (v === '1' ? one : many);
  });
}

// ---- colours: the SVG export's ramp; masked cells grey in every view ----
const RAMP = [[255, 255, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
const MASKED_RGB = [1, 3, 5].map((n) => parseInt(DATA.maskedColour.slice(n, n + 2), 16));
function ramp(f) {
  const t = Math.min(Math.max(isFinite(f) ? f : 0, 0), 1) * 4;
  const lo = Math.min(Math.floor(t), 3), u = t - lo;
  return RAMP[lo].map((c, n) => Math.round(c + (RAMP[lo + 1][n] - c) * u));
}
// A weight's place on the scale: w / ref (linear) or its decade below ref (log).
function shade(w, ref) {
  if (!(w > 0) || !(ref > 0)) return 0;
  if (state.colour === 'log') return Math.max(0, 1 + Math.log10(w / ref) / LOG_DECADES);
  return w / ref;
}
// The colour of a cell: a pooled cell partly masked blends with the masked grey by its allowed
// share; a fully masked one is the masked grey.
function cellRgb(w, ref, allowedShare = 1) {
  const rgb = ramp(shade(w, ref));
  if (allowedShare >= 1) return rgb;
  return rgb.map((c, n) => Math.round(c * allowedShare + MASKED_RGB[n] * (1 - allowedShare)));
}
const css = (rgb) => '#' + rgb.map((c) => c.toString(16).padStart(2, '0')).join('');
const scaleMode = () => state.scale || (isPooledView() ? 'row' : 'global');

// A colour legend: the ramp with its ends named, and the masked grey when any cell is masked.
function drawLegend(box, opts) {
  box.innerHTML = '';
  const log = state.colour === 'log', perRow = scaleMode() === 'row';
  const ref = perRow ? "the row's largest weight" : 'the largest weight in view (' + fixed(opts.max || 0, 4) + ')';
  const steps = 24, width = 240, left = 8;
  const svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('width', 560);
  svg.setAttribute('height', 38);
  svg.setAttribute('aria-hidden', 'true');
  for (let s = 0; s < steps; ++s) {
    const f = s / (steps - 1);
    const r = document.createElementNS(NS, 'rect');
    r.setAttribute('x', left + s * width / steps); r.setAttribute('y', 2);
    r.setAttribute('width', width / steps + 0.5); r.setAttribute('height', 12);
    r.setAttribute('fill', css(ramp(f)));
    svg.appendChild(r);
  }
  const text = (x, s, anchor) => {
    const t = document.createElementNS(NS, 'text');
    t.setAttribute('x', x); t.setAttribute('y', 28); t.setAttribute('font-size', 11);
    t.setAttribute('text-anchor', anchor); t.textContent = s;
    svg.appendChild(t);
  };
  const top = perRow ? 'row max' : fixed(opts.max || 0, 4);
  if (log) {
    for (let k = 0; k <= LOG_DECADES; k += 2) {
      // Per row: decades below each row's largest weight; global: the weights themselves.
      const label = k === LOG_DECADES ? top : perRow ? '1e-' + (LOG_DECADES - k) + '×max'
        : ((opts.max || 0) * 10 ** (k - LOG_DECADES)).toExponential(1);
      text(left + width * k / LOG_DECADES, label, k === 0 ? 'start' : k === LOG_DECADES ? 'end' : 'middle');
    }
  } else {
    text(left, '0', 'start');
    text(left + width / 2, perRow ? '½ row max' : fixed((opts.max || 0) / 2, 4), 'middle');
    text(left + width, top, 'end');
  }
  if (opts.masked) {
    const r = document.createElementNS(NS, 'rect');
    r.setAttribute('x', left + width + 24); r.setAttribute('y', 2);
    r.setAttribute('width', 16); r.setAttribute('height', 12);
    r.setAttribute('fill', DATA.maskedColour);
    svg.appendChild(r);
    text(left + width + 44, 'not allowed (masked)', 'start');
    svg.lastChild.setAttribute('y', 12);
  }
  box.appendChild(svg);
  box.setAttribute('aria-label', 'Colour scale: ' + (log ? 'log, ' + LOG_DECADES + ' decades up to ' : 'linear from 0 (white) to ') +
    ref + (perRow ? ', per row' : ', global') + (opts.masked ? '; grey: not allowed (masked)' : ''));
}

// Axis ticks that never collide: a step of 1, 2 or 5 x 10^k indices, the smallest whose
// spacing on screen holds a label.
function tickStep(pxPerIndex, labelPx) {
  const need = labelPx / Math.max(pxPerIndex, 1e-9);
  for (let k = 1; ; k *= 10) {
    for (const m of [1, 2, 5]) if (m * k >= need) return m * k;
  }
}

// ---- tooltip ----
function tip(ev, text) {
  const t = $('tip');
  if (!text) { t.style.display = 'none'; return; }
  t.textContent = text;
  t.style.display = 'block';
  t.style.left = Math.min(ev.clientX + 14, innerWidth - t.offsetWidth - 4) + 'px';
  t.style.top = ev.clientY + 14 + 'px';
}

// ---- parts, batch elements and heads ----
// Parts that share a title and have batches > 1 are the batch elements of one input.
function groups() {
  const out = [];
  DATA.parts.forEach((p, n) => {
    const last = out[out.length - 1];
    if (last && p.batches > 1 && DATA.parts[last[0]].title === p.title) last.push(n); else out.push([n]);
  });
  return out;
}
const groupOf = (n) => groups().findIndex((g) => g.includes(n));

function selectHead(h) {
  state.head = h;
  state.cursor = null;
  $('head').value = h;
  renderSummary();
  renderHeatmap();
  renderMask();
  renderStoryTables();
  if (part().nq === 0) {
    // An empty input (no queries) has no row to walk through.
    state.row = null;
    $('row').innerHTML = '<p>No queries: there is no row to walk through.</p>';
    delete $('row').dataset.row;
    return;
  }
  showRow(state.row === null ? defaultRow() : state.row);
}

function selectPart(n, head = 0, row = null) {
  state.part = n;
  state.view = null;
  state.row = row;
  const p = part(), g = groups()[groupOf(n)];
  $('part').value = groupOf(n);
  $('part-title').textContent = p.title;
  $('part-facts').textContent = p.facts;
  const batch = $('batch');
  batch.innerHTML = '';
  for (const m of g) batch.add(new Option('batch element ' + DATA.parts[m].batch + ' of ' + DATA.parts[m].batches, m));
  batch.value = n;
  batch.hidden = $('batch-box').hidden = g.length < 2;
  // The batch select names the element; with only one of several embedded, say how to get another.
  $('batch-note').textContent = p.batches > 1 && g.length < 2
    ? say('overview.batch_choice', { batch: p.batch, batches: p.batches }) : '';
  const heads = $('head');
  heads.innerHTML = '';
  for (let h = 0; h < p.heads; ++h) heads.add(new Option('head ' + h, h));
  $('row-input').max = p.nq - 1;
  $('mode-note').textContent = modeNote(p);
  document.body.dataset.rowsMode = p.rowsMode;
  renderStory();
  selectHead(Math.min(Math.max(head, 0), p.heads - 1));
}

function modeNote(p) {
  const maps = p.mapEncoding === 'log8'
    ? ' Maps: weights quantised to 8 bits on a log scale from 1e-6 to 1 (steps of ×1.056; 0 stays 0).' : '';
  if (exactRows(p)) {
    return 'Rows: exact (' + (p.precision === 'f64' ? 'float64' : 'float32, 7 digits') +
      '): every row and zoomed block is recomputed here from Q, K and the lse attention() returned.' + maps;
  }
  const sizes = p.samples.map((s) => s.length);
  const least = Math.min(...sizes), most = Math.max(...sizes);
  return 'Rows: sampled. This input is too large to embed whole, so the page carries walk-throughs of ' +
    (least === most ? count(least, 'row', 'rows') : least + ' to ' + most + ' rows') +
    ' per head (the most and least focused and an even spread), each with its heaviest allowed keys; ' +
    'qkv explain --row i walks through any row in the terminal.' + maps;
}

// The row a head opens on: PageView.row for the opened part, else the head's most focused row.
function defaultRow() {
  const p = part();
  if (state.part === DATA.open.part && DATA.open.row >= 0 && DATA.open.row < p.nq) return DATA.open.row;
  return p.scans[state.head].openRow;
}

function init() {
  document.body.dataset.maskedColour = DATA.maskedColour;
  const partSelect = $('part');
  groups().forEach((g, n) => partSelect.add(new Option((n + 1) + '. ' + DATA.parts[g[0]].short, n)));
  $('part-box').hidden = groups().length < 2;
  partSelect.addEventListener('change', () => selectPart(groups()[+partSelect.value][0]));
  $('batch').addEventListener('change', () => selectPart(+$('batch').value, state.head));
  $('head').addEventListener('change', () => selectHead(+$('head').value));
  $('scale').addEventListener('change', () => { state.scale = $('scale').value; renderHeatmap(); });
  $('colour').addEventListener('change', () => { state.colour = $('colour').value; renderHeatmap(); });
  $('pooling').addEventListener('change', () => { state.pooling = $('pooling').value; renderHeatmap(); });
  $('back').addEventListener('click', () => { state.view = null; renderHeatmap(); });
  $('row-go').addEventListener('click', () => {
    const p = part();
    if (p.nq === 0) return;
    const i = Math.max(0, Math.min(p.nq - 1, Math.floor(+$('row-input').value || 0)));
    if (exactRows(p) && (p.nq > EXACT_CELLS || p.nk > EXACT_CELLS)) zoomTo(i, i + p.nk - p.nq);
    showRow(i);
  });
  setupMapKeys();
  let width = innerWidth;
  addEventListener('resize', () => {
    if (innerWidth === width) return;
    width = innerWidth;
    clearTimeout(state.resize);
    state.resize = setTimeout(() => { renderHeatmap(); renderMask(); }, 150);
  });
  const open = DATA.open;
  const start = open.part >= 0 && open.part < DATA.parts.length ? open.part : 0;
  selectPart(start, open.head, null);
  document.body.dataset.ready = '1';
}
)JS";
}

}  // namespace qkv::explain_detail
