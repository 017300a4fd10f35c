// The explain page's script, second piece: the heatmap (exact cells or a pooled canvas), the
// mask pattern, and the map's keyboard cursor, row highlight and hover tooltip.
//
// Exact cells are recomputed from Q, K and the lse (the exact rows mode only). The pooled
// overview is scan_head()'s map, max- or mean-pooled in C++; a pooled cell's colour blends with
// the masked grey by the share of its (i, j) that are allowed.
#include "explain/page_script.h"

namespace qkv::explain_detail {

const char* page_script_map() noexcept {
  return R"JS(
// ---- one cell, recomputed: s = softcap(scale·r) + ALiBi + bias, w = exp(s - lse) ----
// The library's allowed(i, j) rule (causal and window, bottom-right aligned) and the mask.
function bias(p, h, i, j) {
  const diag = i + p.nk - p.nq;
  if (p.causal && j > diag) return -Infinity;
  if (p.window) {
    if (p.window[0] >= 0 && j < diag - p.window[0]) return -Infinity;
    if (p.window[1] >= 0 && j > diag + p.window[1]) return -Infinity;
  }
  if (p.maskBias) return arr(p, 'maskBias', p.maskPerHead ? h : 0, rowType(p))[i * p.nk + j];
  return 0;
}

function cell(p, h, i, j) {
  const q = arr(p, 'q', h, rowType(p)), k = arr(p, 'k', kvOf(p, h), rowType(p));
  const lse = arr(p, 'lse', h, Float64Array)[i];
  let dot = 0;
  for (let c = 0; c < p.d; ++c) dot += q[i * p.d + c] * k[j * p.d + c];
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

// A pooled map as weights: float32 as embedded, or decoded from 8-bit log steps (0 stays 0).
function pooledMap(p, s, which) {
  const slot = '$map' + which;
  if (s[slot]) return s[slot];
  if (p.mapEncoding === 'f32') return (s[slot] = decode(s[which], Float32Array));
  const bytes = decode(s[which], Uint8Array), out = new Float32Array(bytes.length);
  for (let n = 0; n < bytes.length; ++n) out[n] = bytes[n] ? 10 ** (-6 + (bytes[n] - 1) * 6 / 254) : 0;
  return (s[slot] = out);
}

// The share of each pooled cell's (i, j) that are allowed, 0..255 (a head whose pattern is head
// 0's borrows it).
function allowedShares(p, s) {
  return arr(s.allowed === undefined ? p.scans[s.allowedFrom] : s, 'allowed', null, Uint8Array);
}

function isPooledView() {
  const p = part();
  return !state.view && !(exactRows(p) && p.nq <= EXACT_CELLS && p.nk <= EXACT_CELLS);
}

// ---- the heatmap ----
function renderHeatmap() {
  const p = part(), h = state.head, box = $('heatmap');
  box.innerHTML = '';
  box.classList.toggle('sampled', !exactRows(p));
  const pooled = isPooledView();
  $('scale').value = scaleMode();
  $('pooling').disabled = !pooled;
  const wrap = document.createElement('div');
  wrap.className = 'map-wrap';
  box.appendChild(wrap);
  const info = pooled ? drawPooled(wrap, p, h)
    : drawExact(wrap, p, h, state.view || { r0: 0, c0: 0, rows: p.nq, cols: p.nk });
  state.geom = info.geom;
  drawLegend($('heatmap-legend'), { max: info.max, masked: p.masked });
  box.setAttribute('aria-label', 'Attention weights of head ' + h + ', ' + count(p.nq, 'query', 'queries') + ' down, ' +
    count(p.nk, 'key', 'keys') + ' across' + (pooled ? ', ' + state.pooling + '-pooled' : '') +
    '. Arrow keys move a cursor, Enter walks through its row.');
  $('view-note').textContent = info.note;
  $('back').style.display = state.view ? '' : 'none';
  markRow();
  drawCursor();
}

function mapWidth(left) { return Math.max(160, $('heatmap').clientWidth - left - 12); }

function svgText(svg, x, y, s, anchor, rotate) {
  const t = document.createElementNS(NS, 'text');
  t.setAttribute('x', x); t.setAttribute('y', y);
  t.setAttribute('font-size', 11); t.setAttribute('text-anchor', anchor);
  if (rotate) t.setAttribute('transform', 'rotate(-45 ' + x + ' ' + y + ')');
  t.textContent = s;
  svg.appendChild(t);
}

function drawExact(wrap, p, h, v) {
  const labelled = v.rows <= 40 && v.cols <= 40 && (p.queryLabels || p.keyLabels);
  let longest = 0;
  for (let r = 0; r < v.rows; ++r) longest = Math.max(longest, qlabel(p, v.r0 + r).length);
  const left = labelled ? Math.min(120, 12 + 6.5 * longest) : 44, top = labelled ? 90 : 24;
  const size = Math.max(3, Math.min(40, Math.floor(mapWidth(left) / v.cols)));
  const svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('width', left + v.cols * size + 8);
  svg.setAttribute('height', top + v.rows * size + 8);
  svg.setAttribute('data-rows', v.rows);
  svg.setAttribute('data-cols', v.cols);
  const cells = [], rowMax = new Float64Array(v.rows);
  let max = 0;
  for (let r = 0; r < v.rows; ++r) {
    for (let c = 0; c < v.cols; ++c) {
      const x = cell(p, h, v.r0 + r, v.c0 + c);
      cells.push(x);
      rowMax[r] = Math.max(rowMax[r], x.weight);
    }
    max = Math.max(max, rowMax[r]);
  }
  const perRow = scaleMode() === 'row';
  for (let r = 0; r < v.rows; ++r) {
    for (let c = 0; c < v.cols; ++c) {
      const x = cells[r * v.cols + c];
      const rect = document.createElementNS(NS, 'rect');
      const masked = !isFinite(x.score);
      rect.setAttribute('class', masked ? 'cell masked' : 'cell');
      rect.setAttribute('x', left + c * size);
      rect.setAttribute('y', top + r * size);
      rect.setAttribute('width', size);
      rect.setAttribute('height', size);
      rect.setAttribute('fill', masked ? DATA.maskedColour : css(cellRgb(x.weight, perRow ? rowMax[r] : max)));
      rect.dataset.i = v.r0 + r;
      rect.dataset.j = v.c0 + c;
      svg.appendChild(rect);
    }
  }
  // Labels (names, or indices) at a step that keeps them apart at this cell size.
  const rowStep = tickStep(size, 13);
  const colStep = labelled ? tickStep(size, 15) : tickStep(size, 7 * String(v.c0 + v.cols).length + 8);
  for (let r = 0; r < v.rows; ++r) {
    const i = v.r0 + r;
    if ((labelled ? r : i) % rowStep === 0) svgText(svg, left - 4, top + r * size + size / 2 + 4, labelled ? qlabel(p, i) : i, 'end', false);
  }
  for (let c = 0; c < v.cols; ++c) {
    const j = v.c0 + c;
    if ((labelled ? c : j) % colStep !== 0) continue;
    if (labelled) svgText(svg, left + c * size + size / 2, top - 4, klabel(p, j), 'start', true);
    else svgText(svg, left + c * size + size / 2, top - 6, j, 'middle', false);
  }
  svg.addEventListener('mousemove', (ev) => {
    const d = ev.target.dataset;
    if (d.i === undefined) { tip(ev, null); return; }
    const i = +d.i, j = +d.j, x = cell(p, h, i, j);
    tip(ev, 'query ' + i + ' (' + qlabel(p, i) + ') → key ' + j + ' (' + klabel(p, j) + ')\n' +
      (isFinite(x.score) ? 'score s = ' + fmt(x.score) + '   (r = q·k = ' + fmt(x.raw) + ')\nweight w = ' + fixed(x.weight, 6)
                         : 'not allowed (masked): weight w = 0'));
  });
  svg.addEventListener('mouseleave', (ev) => tip(ev, null));
  svg.addEventListener('click', (ev) => {
    const d = ev.target.dataset;
    if (d.i === undefined) return;
    state.cursor = [+d.i, +d.j];
    showRow(+d.i, { focus: +d.j });
    drawCursor();
    $('heatmap-status').textContent = cursorText(p, +d.i, +d.j);
  });
  wrap.appendChild(svg);
  const note = state.view
    ? 'Zoomed: queries ' + v.r0 + '–' + (v.r0 + v.rows - 1) + ', keys ' + v.c0 + '–' + (v.c0 + v.cols - 1) +
      ', every cell exact. Click a cell for its row.'
    : 'Every (query, key) cell. Hover for numbers, click (or arrow keys and Enter) for the row\'s walk-through.';
  return { max, note, geom: { kind: 'exact', left, top, cw: size, ch: size, r0: v.r0, c0: v.c0, rows: v.rows, cols: v.cols } };
}

// A lookup table for the ramp (1024 steps): a 512 x 512 map is coloured without allocating.
function rampTable() {
  const t = new Uint8Array(1025 * 3);
  for (let n = 0; n <= 1024; ++n) t.set(ramp(n / 1024), n * 3);
  return t;
}

function drawPooled(wrap, p, h) {
  const s = p.scans[h], R = s.mapRows, C = s.mapCols;
  const mean = state.pooling === 'mean' && s.mean;
  const map = pooledMap(p, s, mean ? 'mean' : 'max');
  const share = allowedShares(p, s);
  const left = 44, top = 22;
  const width = Math.min(512, mapWidth(left));
  const height = Math.max(64, Math.round(width * Math.min(2, R / C)));
  const axes = document.createElementNS(NS, 'svg');
  axes.setAttribute('width', left + width + 8);
  axes.setAttribute('height', top + height + 8);
  const rowStep = tickStep(height / p.nq, 14), colStep = tickStep(width / p.nk, 7 * String(p.nk).length + 10);
  for (let i = 0; i < p.nq; i += rowStep) svgText(axes, left - 4, top + (i + 0.5) * height / p.nq + 4, i, 'end', false);
  for (let j = 0; j < p.nk; j += colStep) svgText(axes, left + (j + 0.5) * width / p.nk, top - 6, j, 'middle', false);
  wrap.appendChild(axes);
  const canvas = document.createElement('canvas');
  canvas.width = C;
  canvas.height = R;
  canvas.style.left = left + 'px';
  canvas.style.top = top + 'px';
  canvas.style.width = width + 'px';
  canvas.style.height = height + 'px';
  canvas.dataset.rows = R;
  canvas.dataset.cols = C;
  let max = 0;
  const rowMax = new Float32Array(R);
  for (let a = 0; a < R; ++a) {
    for (let b = 0; b < C; ++b) rowMax[a] = Math.max(rowMax[a], map[a * C + b]);
    max = Math.max(max, rowMax[a]);
  }
  const perRow = scaleMode() === 'row', table = rampTable();
  const img = canvas.getContext('2d').createImageData(C, R);
  for (let n = 0; n < map.length; ++n) {
    const f = Math.min(1, shade(map[n], perRow ? rowMax[Math.floor(n / C)] : max));
    const t = Math.round(f * 1024) * 3, a = share[n] / 255;
    for (let c = 0; c < 3; ++c) img.data[n * 4 + c] = Math.round(table[t + c] * a + MASKED_RGB[c] * (1 - a));
    img.data[n * 4 + 3] = 255;
  }
  canvas.getContext('2d').putImageData(img, 0, 0);
  canvas.addEventListener('mousemove', (ev) => {
    const x = pooledAt(canvas, ev);
    tip(ev, blockText(p, s, map, x.a, x.b, mean));
  });
  canvas.addEventListener('mouseleave', (ev) => tip(ev, null));
  canvas.addEventListener('click', (ev) => {
    const x = pooledAt(canvas, ev), [i0, i1] = block(x.a, p.nq, R), [j0, j1] = block(x.b, p.nk, C);
    const i = Math.floor((i0 + i1) / 2), j = Math.floor((j0 + j1) / 2);
    state.cursor = [i, j];
    if (exactRows(p)) zoomTo(i, j);
    showRow(i, { focus: j });
    drawCursor();
    $('heatmap-status').textContent = cursorText(p, i, j);
  });
  wrap.style.width = left + width + 8 + 'px';
  wrap.style.height = top + height + 8 + 'px';
  wrap.appendChild(canvas);
  const what = mean ? 'the mean weight over its allowed cells' : 'the largest weight in its block';
  const note = (mean || state.pooling !== 'mean' ? '' : 'Mean pooling is not in this page\'s data: showing max pooling. ') +
    (R === p.nq && C === p.nk ? 'Every cell' : 'Pooled to ' + R + ' x ' + C + ' cells') + ' (each shows ' + what + ').' +
    (exactRows(p) ? ' Click to zoom into 64 x 64 exact cells.' : ' Click to open the nearest sampled row.');
  return { max, note, geom: { kind: 'pooled', left, top, cw: width / C, ch: height / R, rows: R, cols: C } };
}

// Indices [first, last] of pooled cell a when n indices are pooled into `cells` (head_scan.cc's
// bins: index j falls in cell floor(j·cells / n)).
const block = (a, n, cells) => [Math.ceil(a * n / cells), Math.ceil((a + 1) * n / cells) - 1];
const binOf = (j, n, cells) => Math.floor(j * cells / n);

function pooledAt(canvas, ev) {
  const b = canvas.getBoundingClientRect(), R = +canvas.dataset.rows, C = +canvas.dataset.cols;
  return { a: Math.max(0, Math.min(R - 1, Math.floor((ev.clientY - b.top) / b.height * R))),
           b: Math.max(0, Math.min(C - 1, Math.floor((ev.clientX - b.left) / b.width * C))) };
}

function blockText(p, s, map, a, b, mean) {
  const [i0, i1] = block(a, p.nq, s.mapRows), [j0, j1] = block(b, p.nk, s.mapCols);
  const share = allowedShares(p, s)[a * s.mapCols + b];
  const range = (x, y) => (x === y ? String(x) : x + '–' + y);
  return (i0 === i1 ? 'query ' : 'queries ') + range(i0, i1) + (j0 === j1 ? ', key ' : ', keys ') + range(j0, j1) + ': ' +
    (share === 0 ? 'not allowed (masked)' : (mean ? 'mean' : 'largest') + ' weight ' +
      (p.mapEncoding === 'log8' ? '≈ ' : '') + fixed(map[a * s.mapCols + b], 6) +
      (share < 255 ? ' (' + Math.round(share / 2.55) + '% allowed)' : ''));
}

function zoomTo(i, j) {
  const p = part();
  const rows = Math.min(EXACT_CELLS, p.nq), cols = Math.min(EXACT_CELLS, p.nk);
  const r0 = Math.max(0, Math.min(p.nq - rows, i - (rows >> 1)));
  const c0 = Math.max(0, Math.min(p.nk - cols, j - (cols >> 1)));
  state.view = { r0, c0, rows, cols };
  renderHeatmap();
}

// ---- where an index is on the map, for the highlight and the cursor ----
function mapCell(i, j) {
  const g = state.geom, p = part();
  if (!g) return null;
  if (g.kind === 'exact') {
    const a = i - g.r0, b = j === null ? 0 : j - g.c0;
    return a < 0 || a >= g.rows || b < 0 || b >= g.cols ? null : { a, b };
  }
  return { a: binOf(i, p.nq, g.rows), b: j === null ? 0 : binOf(j, p.nk, g.cols) };
}

function overlay(className, x, y, w, h) {
  const wrap = $('heatmap').querySelector('.map-wrap');
  const div = document.createElement('div');
  div.className = className;
  div.style.left = x - 2 + 'px'; div.style.top = y - 2 + 'px';
  div.style.width = w + 4 + 'px'; div.style.height = Math.max(h, 2) + 4 + 'px';
  wrap.appendChild(div);
}

function markRow() {
  const box = $('heatmap');
  for (const old of box.querySelectorAll('.row-highlight')) old.remove();
  if (state.row === null) { delete box.dataset.row; return; }
  box.dataset.row = state.row;
  const at = mapCell(state.row, null), g = state.geom;
  if (at) overlay('row-highlight', g.left, g.top + at.a * g.ch, g.cols * g.cw, g.ch);
}

function drawCursor() {
  const box = $('heatmap');
  for (const old of box.querySelectorAll('.map-cursor')) old.remove();
  if (!state.cursor) { delete box.dataset.cursor; return; }
  const [i, j] = state.cursor, g = state.geom, at = mapCell(i, j);
  box.dataset.cursor = i + ',' + j;
  if (at) overlay('map-cursor', g.left + at.b * g.cw, g.top + at.a * g.ch, g.cw, g.ch);
}

// Arrow keys move the cursor one cell (one pooled block in the overview); Enter walks through
// the cursor's row; Escape leaves a zoomed view.
function setupMapKeys() {
  const box = $('heatmap');
  box.addEventListener('keydown', (ev) => {
    const p = part(), g = state.geom;
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    if (!g || p.nq === 0 || p.nk === 0) return;
    if (ev.key === 'Escape' && state.view) { state.view = null; renderHeatmap(); return; }
    if (ev.key === 'Enter' && state.cursor) {
      ev.preventDefault();
      showRow(state.cursor[0], { focus: state.cursor[1] });
      return;
    }
    if (!moves[ev.key]) return;
    ev.preventDefault();
    const [di, dj] = moves[ev.key];
    let [i, j] = state.cursor || [state.row === null ? 0 : state.row, 0];
    if (g.kind === 'exact') {
      i = Math.max(g.r0, Math.min(g.r0 + g.rows - 1, i + (state.cursor ? di : 0)));
      j = Math.max(g.c0, Math.min(g.c0 + g.cols - 1, j + (state.cursor ? dj : 0)));
    } else if (state.cursor) {
      const a = Math.max(0, Math.min(g.rows - 1, binOf(i, p.nq, g.rows) + di));
      const b = Math.max(0, Math.min(g.cols - 1, binOf(j, p.nk, g.cols) + dj));
      i = block(a, p.nq, g.rows)[0];
      j = block(b, p.nk, g.cols)[0];
    }
    state.cursor = [i, j];
    drawCursor();
    $('heatmap-status').textContent = cursorText(p, i, j);
  });
}

function cursorText(p, i, j) {
  const g = state.geom, h = state.head;
  if (g.kind === 'exact') {
    const x = cell(p, h, i, j);
    return 'query ' + i + ' "' + qlabel(p, i) + '", key ' + j + ' "' + klabel(p, j) + '": ' +
      (isFinite(x.score) ? 'weight ' + fmt(x.weight) : 'not allowed (masked)');
  }
  const s = p.scans[h], mean = state.pooling === 'mean' && s.mean;
  return blockText(p, s, pooledMap(p, s, mean ? 'mean' : 'max'), binOf(i, p.nq, g.rows), binOf(j, p.nk, g.cols), mean);
}

// ---- the mask pattern (from the rule alone: no weights needed) ----
const ALLOWED_COLOUR = '#44506a';
function renderMask() {
  const p = part(), s = p.scans[state.head], box = $('mask'), legend = $('mask-legend');
  box.innerHTML = '';
  legend.innerHTML = '';
  legend.hidden = !p.masked;
  if (!p.masked) { box.textContent = 'No mask: every query may attend to every key.'; return; }
  const share = allowedShares(p, s);
  const canvas = document.createElement('canvas');
  canvas.width = s.mapCols; canvas.height = s.mapRows;
  const width = Math.min(256, Math.max(120, box.clientWidth - 4));
  canvas.style.width = width + 'px';
  canvas.style.height = Math.max(32, Math.round(width * Math.min(2, s.mapRows / s.mapCols))) + 'px';
  const img = canvas.getContext('2d').createImageData(s.mapCols, s.mapRows);
  const on = [1, 3, 5].map((n) => parseInt(ALLOWED_COLOUR.slice(n, n + 2), 16));
  for (let n = 0; n < share.length; ++n) {
    const a = share[n] / 255;
    for (let c = 0; c < 3; ++c) img.data[n * 4 + c] = Math.round(on[c] * a + MASKED_RGB[c] * (1 - a));
    img.data[n * 4 + 3] = 255;
  }
  canvas.getContext('2d').putImageData(img, 0, 0);
  box.appendChild(canvas);
  const note = document.createElement('div');
  note.className = 'muted';
  note.textContent = 'Query i (down) may attend to key j (across) where the cell is dark (' + p.maskText + ').' +
    (s.mapRows < p.nq || s.mapCols < p.nk ? ' Pooled: a cell partly allowed is in between.' : '');
  box.appendChild(note);
  legend.innerHTML = '<svg width="360" height="18" aria-hidden="true"><rect x="2" y="3" width="16" height="12" fill="' + ALLOWED_COLOUR +
    '"/><text x="24" y="13" font-size="11">allowed</text><rect x="90" y="3" width="16" height="12" fill="' + DATA.maskedColour +
    '"/><text x="112" y="13" font-size="11">not allowed (masked)</text></svg>';
  legend.setAttribute('aria-label', 'Mask legend: dark slate is allowed, grey is not allowed (masked); pooled cells blend by their allowed share');
}
)JS";
}

}  // namespace qkv::explain_detail
