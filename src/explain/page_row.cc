// The explain page's script, third piece: one row's walk-through, in the terminal's steps and
// words, and O_i drawn as the stacked sum of w_ij·v_j.
//
// A row comes either recomputed here from the embedded Q, K, V and lse (exact rows) or as
// page_data.cc's precomputed walk-through (sampled rows); both give the same record, so one
// renderer serves both. Only allowed keys are ranked, counted and listed.
#include "explain/page_script.h"

namespace qkv::explain_detail {

const char* page_script_row() noexcept {
  return R"JS(
const TOP_KEYS = 8;      // the terminal's default --top
const ALL_KEYS = 4096;   // #row-all lists at most this many allowed keys
const STACK_KEYS = 8;    // keys drawn one by one in the stacked sum; the rest as one term
const STACK_COORDS = 24; // value coordinates drawn
const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#9c755f'];

// One row of one head, recomputed from Q, K, V and the lse.
function exactRow(p, h, i) {
  const T = rowType(p);
  const cells = [];
  for (let j = 0; j < p.nk; ++j) cells.push(cell(p, h, i, j));
  const lse = arr(p, 'lse', h, Float64Array)[i];
  const order = [];
  for (let j = 0; j < p.nk; ++j) if (isFinite(cells[j].score)) order.push(j);
  order.sort((a, b) => cells[b].weight - cells[a].weight);  // stable: ties keep index order
  // Over the keys' weights renormalised to 1 (a sink takes a share), as walk_through() does.
  let entropy = 0, total = 0;
  for (const c of cells) if (c.weight > 0) { entropy -= c.weight * Math.log(c.weight); total += c.weight; }
  if (total > 0) entropy = entropy / total + Math.log(total);
  entropy = Math.max(entropy, 0);
  const v = arr(p, 'v', kvOf(p, h), T);
  const vj = (j) => v.subarray(j * p.dv, (j + 1) * p.dv);
  const out = arr(p, 'out', h, T).slice(i * p.dv, (i + 1) * p.dv);
  const sum = new Float64Array(p.dv);
  for (const j of order) for (let c = 0; c < p.dv; ++c) sum[c] += cells[j].weight * v[j * p.dv + c];
  let diff = 0;
  for (let c = 0; c < p.dv; ++c) diff = Math.max(diff, Math.abs(out[c] - sum[c]));
  return {
    row: i, lse, allowed: order.length, order, complete: true, entropy,
    effective: isFinite(lse) ? Math.exp(entropy) : 0,
    sink: p.sinks && isFinite(lse) ? Math.exp(p.sinks[h] - lse) : 0,
    w: (j) => cells[j].weight, r: (j) => cells[j].raw, s: (j) => cells[j].score, vj,
    q: arr(p, 'q', h, T).slice(i * p.d, (i + 1) * p.d),
    x: p.x ? arr(p, 'x', null, T).slice(i * p.projection.dx, (i + 1) * p.projection.dx) : null,
    out, diff,
  };
}

// One sampled row: the walk-through page_data.cc made with walk_through().
function sampledRow(p, h, s) {
  const at = new Map(s.keys.map((j, n) => [j, n]));
  const v = decode(s.v, Float32Array);
  return {
    row: s.row, lse: s.lse === null ? -Infinity : s.lse, allowed: s.allowed, order: s.keys,
    complete: s.keys.length === s.allowed, entropy: s.entropy, effective: s.effective, sink: s.sink,
    w: (j) => s.w[at.get(j)], r: (j) => s.r[at.get(j)], s: (j) => (s.s[at.get(j)] === null ? -Infinity : s.s[at.get(j)]),
    vj: (j) => v.subarray(at.get(j) * p.dv, (at.get(j) + 1) * p.dv),
    q: decode(s.q, Float32Array), x: s.x ? decode(s.x, Float32Array) : null, out: decode(s.out, Float32Array),
    diff: s.diff, rest: s.rest,
  };
}

// A vector as a table: its coordinates' names above its values (at most `limit` columns).
function vecTable(values, labels, limit = 16, lead = null) {
  const n = Math.min(values.length, limit);
  let head = lead ? '<th class="label">' + esc(lead[0]) + '</th>' : '', body = lead ? '<td class="label">' + lead[1] + '</td>' : '';
  for (let c = 0; c < n; ++c) {
    head += '<th>' + esc(coord(labels, c)) + '</th>';
    body += '<td>' + fmt(values[c]) + '</td>';
  }
  if (values.length > n) { head += '<th>…</th>'; body += '<td class="muted">' + (values.length - n) + ' more</td>'; }
  return '<div class="scroll"><table class="vec"><tr>' + head + '</tr><tr>' + body + '</tr></table></div>';
}

function showRow(i, opts = {}) {
  const p = part(), h = state.head, box = $('row');
  let note = '', d;
  if (exactRows(p)) {
    d = exactRow(p, h, i);
  } else {
    const list = p.samples[h];
    let best = list[0];
    for (const s of list) if (Math.abs(s.row - i) < Math.abs(best.row - i)) best = s;
    if (best.row !== i) {
      note = 'Query ' + i + ' is not among the sampled rows of this page: showing the nearest sampled row, query ' + best.row +
        '. Run qkv explain --row ' + i + (p.heads > 1 ? ' --head ' + h : '') + ' for query ' + i + ' itself.';
    }
    d = sampledRow(p, h, best);
  }
  state.row = d.row;
  $('row-input').value = d.row;
  box.innerHTML = walkHtml(p, h, d, note, opts.focus);
  box.dataset.row = d.row;
  box.dataset.head = h;
  markRow();
}

function walkHtml(p, h, d, note, focus) {
  const i = d.row, sub = (s) => '<sub>' + s + '</sub>';
  const hasWeights = isFinite(d.lse) && d.allowed > 0;
  let html = '<h2>Query ' + i + (p.queryLabels ? ' “' + esc(qlabel(p, i)) + '”' : '') + (p.heads > 1 ? ', head ' + h : '') +
    (p.batches > 1 ? ', batch element ' + p.batch : '') + '</h2>';
  if (note) html += '<p class="note" id="row-note">' + esc(note) + '</p>';
  if (!exactRows(p)) html += '<p class="muted">A sampled row: its numbers were computed in C++ when the page was made (vectors to float32).</p>';
  html += '<ol class="steps"><li>';
  if (d.x) {
    html += 'x' + sub(i) + ' (row ' + i + ' of ' + esc(p.projection.xName) + ')' + vecTable(d.x, p.sampleLabels) +
      'q' + sub(i) + ' = x' + sub(i) + '·W<sup>Q</sup>' + (p.heads > 1 ? ' (columns of head ' + h + ')' : '') +
      (p.projection.bias ? ' + b<sup>Q</sup>' : '') + vecTable(d.q, p.dLabels);
  } else {
    html += 'q' + sub(i) + ' (row ' + i + ' of ' + (p.projection ? esc(p.projection.xName) + '·W<sup>Q</sup>' : 'Q') + ')' + vecTable(d.q, p.dLabels);
  }
  html += '</li><li>Raw relevance r' + sub(i + 'j') + ' = q' + sub(i) + '·k' + sub('j') + ' (how well each key matches the query)</li>';
  // The terminal's rule: a short row lists every key (forbidden ones with s = -inf), a long one
  // its heaviest allowed keys.
  const allKeys = p.nk <= TOP_KEYS + 4 && exactRows(p);
  const listed = d.allowed <= TOP_KEYS + 4 ? d.allowed : TOP_KEYS;
  const shown = allKeys ? Array.from({ length: p.nk }, (_, j) => j) : d.order.slice(0, listed);
  html += '<li>Scores s' + sub(i + 'j') + ' = ' +
    (p.softcap > 0 ? g6(p.softcap) + '·tanh(' + g6(p.scale) + '·r' + sub(i + 'j') + ' / ' + g6(p.softcap) + ')'
                   : g6(p.scale) + '·r' + sub(i + 'j')) +
    (p.alibi ? ' − ' + g6(p.alibi[h]) + '·|' + (i + p.nk - p.nq) + ' − j|' : '') +
    (p.masked ? ' + mask (−inf: not allowed)' : '') + ':';
  if (p.softcap > 0) html += '<p class="muted">Soft-capped: the scaled score passes through ' + g6(p.softcap) + '·tanh(x / ' + g6(p.softcap) + '), so no score leaves (−' + g6(p.softcap) + ', ' + g6(p.softcap) + ').</p>';
  if (p.alibi) html += '<p class="muted">ALiBi: a penalty that grows with the distance from the query\'s position.</p>';
  // The terminal's columns: r, then the capped score and the ALiBi term when those apply, then s.
  const capped = (r) => (p.softcap > 0 ? p.softcap * Math.tanh(p.scale * r / p.softcap) : p.scale * r);
  const alibi = (j) => -p.alibi[h] * Math.abs(i + p.nk - p.nq - j);
  if (shown.length) {
    html += '<div class="scroll"><table id="row-scores"><tr><th class="label">key</th><th>r</th>' +
      (p.softcap > 0 ? '<th>capped</th>' : '') + (p.alibi ? '<th>ALiBi</th>' : '') + '<th>s</th></tr>';
    for (const j of shown) {
      html += '<tr data-j="' + j + '"><td class="label">' + esc(klabel(p, j)) + '</td><td>' + fmt(d.r(j)) + '</td>' +
        (p.softcap > 0 ? '<td>' + fmt(capped(d.r(j))) + '</td>' : '') + (p.alibi ? '<td>' + fmt(alibi(j)) + '</td>' : '') +
        '<td>' + fmt(d.s(j)) + '</td></tr>';
    }
    html += '</table></div>';
  }
  if (!allKeys && listed < d.allowed) {
    html += '<p class="muted">' + esc(say('scores.heaviest', { shown: listed, allowed: d.allowed, hidden: d.allowed - listed })) + '</p>';
  }
  if (!allKeys && d.allowed < p.nk) html += '<p class="muted">' + esc(say('scores.left_out', { masked: p.nk - d.allowed })) + '</p>';
  html += '</li><li>' + esc(say('weights.heading', { row: i, lse: fmt(d.lse) }));
  if (p.sinks) {
    html += '<p>' + esc(say('weights.sink', { sink: fmt(p.sinks[h]), share: fmt(d.sink), sum: fmt(1 - d.sink) })) + '</p>';
    if (d.allowed === 0) html += '<p class="none">' + esc(say('weights.none_sink', { row: i })) + '</p>';
  } else if (!hasWeights) {
    html += '<p class="none">' + esc(say('weights.none', { row: i })) + '</p>';
  }
  const bars = hasWeights ? listed : 0;
  let rest = hasWeights ? 1 - d.sink : 0;
  if (bars) {
    const top = d.w(d.order[0]);
    html += '<div class="scroll"><table id="row-bars">';
    for (const j of d.order.slice(0, bars)) {
      rest -= d.w(j);
      html += '<tr data-j="' + j + '"' + (j === focus ? ' class="focus" style="background:#fff4e5"' : '') + '><td class="label">' +
        esc(klabel(p, j)) + '</td><td>' + fmt(d.w(j)) + '</td><td class="label"><span class="bar" style="width:' +
        Math.round(200 * d.w(j) / Math.max(top, 1e-300)) + 'px"></span></td></tr>';
    }
    if (bars < d.allowed) {
      if (d.rest !== undefined) rest = d.rest + d.order.slice(bars).reduce((a, j) => a + d.w(j), 0);
      html += '<tr class="more"><td class="label">' + esc(say('weights.more', { rest: d.allowed - bars })) + '</td><td colspan="2" class="label">' +
        esc(say('weights.more_sum', { sum: fmt(Math.max(rest, 0)) })) + '</td></tr>';
    }
    html += '</table></div>';
  }
  html += '</li>';
  if (hasWeights) {
    html += '<li>' + esc(say('values.heading')) + '<div class="scroll"><table class="vec"><tr><th class="label">key</th><th>w</th>';
    const dv = Math.min(p.dv, 16);
    for (let c = 0; c < dv; ++c) html += '<th>' + esc(coord(p.dvLabels, c)) + '</th>';
    html += (p.dv > dv ? '<th>…</th>' : '') + '</tr>';
    for (const j of d.order.slice(0, Math.min(bars, 3))) {
      const v = d.vj(j);
      html += '<tr><td class="label">' + esc(klabel(p, j)) + '</td><td>' + fmt(d.w(j)) + ' ×</td>';
      for (let c = 0; c < dv; ++c) html += '<td>' + fmt(v[c]) + '</td>';
      html += (p.dv > dv ? '<td class="muted">' + (p.dv - dv) + ' more</td>' : '') + '</tr>';
    }
    html += '</table></div></li>';
  }
  const line = !hasWeights ? say('output.none', { row: i })
    : d.allowed === p.nk ? say('output.sum_all', { row: i, nk: p.nk }) : say('output.sum', { row: i, allowed: d.allowed });
  html += '<li><span class="output">' + esc(line) + '</span>' + vecTable(d.out, p.dvLabels) +
    '<span class="muted">' + esc(say('output.check', { row: i, bound: bound(d.diff) })) + '</span>' +
    (hasWeights ? stackedSum(p, d) : '') + '</li>';
  html += '<li><span class="entropy">' + esc(hasWeights
    ? say('entropy', { entropy: fmt(d.entropy), effective: fixed(d.effective, 2), allowed: d.allowed })
    : say('entropy.none')) + '</span></li></ol>';
  // Every allowed key, heaviest first (masked keys have no weight to list).
  const all = d.order.slice(0, ALL_KEYS);
  html += '<details id="row-all-details"><summary>' + (d.complete && all.length === d.allowed
    ? 'every allowed key (' + count(d.allowed, 'key', 'keys') + ')'
    : 'the ' + all.length + ' heaviest allowed keys of ' + d.allowed) +
    '</summary><div class="scroll"><table id="row-all"><tr><th>j</th><th class="label">key</th><th>r</th><th>s</th><th>w</th></tr>';
  for (const j of all) {
    html += '<tr data-j="' + j + '" data-weight="' + d.w(j).toPrecision(17) + '"><td>' + j + '</td><td class="label">' +
      esc(klabel(p, j)) + '</td><td>' + fmt(d.r(j)) + '</td><td>' + fmt(d.s(j)) + '</td><td>' + fixed(d.w(j), 6) + '</td></tr>';
  }
  if (all.length < d.allowed) {
    const listedWeight = all.reduce((a, j) => a + d.w(j), 0);
    html += '<tr class="more"><td></td><td class="label" colspan="4">' + esc(say('weights.more', { rest: d.allowed - all.length })) + ' ' +
      esc(say('weights.more_sum', { sum: fmt(Math.max(1 - d.sink - listedWeight, 0)) })) + '</td></tr>';
  }
  return html + '</table></div></details>';
}

// O_i as the stacked sum of w_ij·v_j: per value coordinate, one bar segment per key (its
// colour), positive parts stacked right of zero and negative parts left, with the total O_ic
// marked. The heaviest keys are drawn one by one; the other allowed keys make one grey term
// (O_ic minus the drawn terms), so every bar ends at attention()'s O_ic.
function stackedSum(p, d) {
  const keys = d.order.slice(0, STACK_KEYS), coords = Math.min(p.dv, STACK_COORDS);
  const terms = keys.map((j) => ({ j, w: d.w(j), v: d.vj(j) }));
  const restTerm = new Float64Array(coords);
  for (let c = 0; c < coords; ++c) {
    restTerm[c] = d.out[c];
    for (const t of terms) restTerm[c] -= t.w * t.v[c];
  }
  const hasRest = d.allowed > keys.length;
  let lo = 0, hi = 0;
  for (let c = 0; c < coords; ++c) {
    let pos = 0, neg = 0;
    for (const t of terms) { const x = t.w * t.v[c]; if (x > 0) pos += x; else neg += x; }
    if (hasRest) { if (restTerm[c] > 0) pos += restTerm[c]; else neg += restTerm[c]; }
    hi = Math.max(hi, pos, d.out[c]);
    lo = Math.min(lo, neg, d.out[c]);
  }
  if (hi - lo === 0) hi = 1;
  const labelW = Math.min(130, 16 + 6.5 * Math.max(...Array.from({ length: coords }, (_, c) => coord(p.dvLabels, c).length))),
    barW = Math.max(160, Math.min(560, ($('row').clientWidth || 400) - labelW - 90)), rowH = 20, top = 8;
  const x = (value) => labelW + (value - lo) / (hi - lo) * barW;
  const height = top + coords * rowH + 8;
  // A viewBox lets the drawing shrink to its box (narrow screens, indented lists) instead of
  // scrolling; it never grows past its natural width.
  const svgW = labelW + barW + 80;
  let svg = '<svg id="stacked-sum" role="img" width="' + svgW + '" height="' + height + '" viewBox="0 0 ' + svgW + ' ' +
    height + '" style="max-width:100%;height:auto" aria-label="O_' + d.row +
    ' as the stacked sum of w_ij·v_j, one bar per value coordinate">';
  svg += '<line x1="' + x(0) + '" x2="' + x(0) + '" y1="' + (top - 4) + '" y2="' + (height - 4) + '" stroke="#667085"/>';
  // Each rect carries its exact w_ij·v_jc (data-value) and its coordinate (data-c); a key's
  // group its weight (data-weight), so the sum can be checked from the drawing.
  const segment = (c, base, value, colour, title) => {
    const x0 = x(Math.min(base, base + value)), w = Math.abs(x(base + value) - x(base));
    return '<rect data-c="' + c + '" data-value="' + value + '" x="' + x0.toFixed(2) + '" y="' + (top + c * rowH + 3) + '" width="' + w.toFixed(2) +
      '" height="' + (rowH - 6) + '" fill="' + colour + '"><title>' + esc(title) + '</title></rect>';
  };
  const pos = new Float64Array(coords), neg = new Float64Array(coords);
  const group = (cls, j, colour, value, name) => {
    let g = '<g class="' + cls + '"' + (j === null ? '' : ' data-j="' + j + '" data-weight="' + d.w(j) + '"') + '>';
    for (let c = 0; c < coords; ++c) {
      const v = value(c);
      if (v >= 0) { g += segment(c, pos[c], v, colour, name + ': ' + fmt(v)); pos[c] += v; } else { g += segment(c, neg[c], v, colour, name + ': ' + fmt(v)); neg[c] += v; }
    }
    return g + '</g>';
  };
  terms.forEach((t, n) => {
    svg += group('term', t.j, PALETTE[n % PALETTE.length], (c) => t.w * t.v[c], klabel(p, t.j) + ' (w = ' + fmt(t.w) + ')');
  });
  if (hasRest) svg += group('rest', null, '#c9ced8', (c) => restTerm[c], count(d.allowed - keys.length, 'other allowed key', 'other allowed keys'));
  for (let c = 0; c < coords; ++c) {
    const y = top + c * rowH;
    svg += '<text x="' + (labelW - 6) + '" y="' + (y + 14) + '" text-anchor="end">' + esc(coord(p.dvLabels, c)) + '</text>';
    svg += '<line class="total" data-c="' + c + '" data-total="' + d.out[c] + '" x1="' + x(d.out[c]).toFixed(2) + '" x2="' + x(d.out[c]).toFixed(2) +
      '" y1="' + y + '" y2="' + (y + rowH) + '" stroke="#111" stroke-width="2"><title>O_' + d.row + c + ' = ' + fmt(d.out[c]) + '</title></line>';
    svg += '<text x="' + (labelW + barW + 8) + '" y="' + (y + 14) + '">' + fmt(d.out[c]) + '</text>';
  }
  svg += '</svg>';
  let legend = '<p class="muted">';
  terms.forEach((t, n) => {
    legend += '<span style="display:inline-block;width:10px;height:10px;background:' + PALETTE[n % PALETTE.length] + '"></span> ' +
      esc(klabel(p, t.j)) + ' (w = ' + fmt(t.w) + ') &nbsp; ';
  });
  if (hasRest) legend += '<span style="display:inline-block;width:10px;height:10px;background:#c9ced8"></span> ' + esc(count(d.allowed - keys.length, 'other allowed key', 'other allowed keys'));
  legend += '</p>';
  return '<h3>O<sub>' + d.row + '</sub> = Σ<sub>j</sub> w<sub>' + d.row + 'j</sub>·v<sub>j</sub>, drawn: each bar is one value coordinate, ' +
    'each colour one key\'s w·v; the black mark is the total O<sub>' + d.row + 'c</sub>' +
    (p.dv > coords ? ' (the first ' + coords + ' of ' + p.dv + ' coordinates)' : '') + '</h3>' +
    '<p class="muted">A weighted sum of every allowed key\'s value, not a lookup of the best one.</p>' +
    '<div class="scroll">' + svg + '</div>' + legend;
}
)JS";
}

}  // namespace qkv::explain_detail
