// The explain page's script, fourth piece: the part's story, K and V as two transforms of the
// same rows (the key/value table), and the head summary table.
#include "explain/page_script.h"

namespace qkv::explain_detail {

const char* page_script_story() noexcept {
  return R"JS(
// The story's paragraphs (blank-line separated), then for the layer form how K and V come from
// the same key/value-side rows.
function renderStory() {
  const p = part(), box = $('story');
  box.hidden = !p.story && !p.projection;
  if (box.hidden) { box.innerHTML = ''; return; }
  // The header names the part already; the story's own heading is its short name.
  let html = p.story ? '<h2>' + esc(p.short || p.title) + '</h2>' : '';
  for (const para of p.story.split(/\n\s*\n/)) if (para.trim()) html += '<p>' + esc(para.trim()) + '</p>';
  if (p.projection) {
    const m = esc(p.projection.memoryName);
    html += (p.story ? '<h3>' : '<h2>') + 'Keys and values: two transforms of the same rows' + (p.story ? '</h3>' : '</h2>') + '<p>Each key/value row m<sub>j</sub> (a row of ' + m +
      ') is projected twice: <span class="flow">m<sub>j</sub> → ·W<sup>K</sup> → k<sub>j</sub></span> what the row can be matched by' +
      (p.dLabels ? ' (' + esc(p.dLabels.slice(0, 6).join(', ')) + (p.dLabels.length > 6 ? ', …' : '') + ')' : '') +
      ', and <span class="flow">m<sub>j</sub> → ·W<sup>V</sup> → v<sub>j</sub></span> what it gives when attended to' +
      (p.dvLabels ? ' (' + esc(p.dvLabels.slice(0, 6).join(', ')) + (p.dvLabels.length > 6 ? ', …' : '') + ')' : '') +
      '. A query q<sub>i</sub> = x<sub>i</sub>·W<sup>Q</sup> is compared with every k<sub>j</sub>; the output O<sub>i</sub> mixes the v<sub>j</sub>.</p>' +
      // A generic input's table is long: folded unless the part tells a story or is short.
      '<details id="kv-details"' + (p.story || p.nk <= 12 ? ' open' : '') + '><summary>the key/value rows (' +
      (p.kvRows.rows < p.nk ? 'first ' + p.kvRows.rows + ' of ' + p.nk : count(p.nk, 'row', 'rows')) + ')</summary><div id="kv-box"></div></details>';
  }
  box.innerHTML = html;
}


// The key/value rows of the current head's kv head: m_j beside k_j and v_j.
function renderStoryTables() {
  const p = part(), box = $('kv-box');
  if (!box || !p.kvRows) return;
  const t = p.kvRows, kv = kvOf(p, state.head);
  const m = arr(t, 'm', null, Float64Array), k = arr(t, 'k', kv, Float64Array), v = arr(t, 'v', kv, Float64Array);
  const more = (shown, all) => (all > shown ? '<th class="muted">…</th>' : '');
  const moreCell = (shown, all) => (all > shown ? '<td class="muted">' + (all - shown) + ' more</td>' : '');
  const labels = p.memoryLabels;
  let html = '<div class="scroll"><table id="kv-rows" class="vec"><tr><th class="label" rowspan="2">' +
    (p.cross ? 'key/value row' : 'row') + '</th><th class="group" colspan="' + (t.dm + (p.projection.dm > t.dm)) + '">m<sub>j</sub> (row of ' +
    esc(t.memoryName) + ')</th><th class="group" colspan="' + (t.d + (p.d > t.d)) + '">k<sub>j</sub> = m<sub>j</sub>·W<sup>K</sup>' +
    (p.kvHeads > 1 ? ' (kv head ' + kv + ')' : '') + '</th><th class="group" colspan="' + (t.dv + (p.dv > t.dv)) +
    '">v<sub>j</sub> = m<sub>j</sub>·W<sup>V</sup></th></tr><tr>';
  for (let c = 0; c < t.dm; ++c) html += '<th>' + esc(coord(labels, c)) + '</th>';
  html += more(t.dm, p.projection.dm);
  for (let c = 0; c < t.d; ++c) html += '<th>' + esc(coord(p.dLabels, c)) + '</th>';
  html += more(t.d, p.d);
  for (let c = 0; c < t.dv; ++c) html += '<th>' + esc(coord(p.dvLabels, c)) + '</th>';
  html += more(t.dv, p.dv) + '</tr>';
  for (let j = 0; j < t.rows; ++j) {
    html += '<tr data-j="' + j + '"><th class="label">' + esc(klabel(p, j)) + '</th>';
    for (let c = 0; c < t.dm; ++c) html += '<td>' + fmt(m[j * t.dm + c]) + '</td>';
    html += moreCell(t.dm, p.projection.dm);
    for (let c = 0; c < t.d; ++c) html += '<td>' + fmt(k[j * t.d + c]) + '</td>';
    html += moreCell(t.d, p.d);
    for (let c = 0; c < t.dv; ++c) html += '<td>' + fmt(v[j * t.dv + c]) + '</td>';
    html += moreCell(t.dv, p.dv) + '</tr>';
  }
  html += '</table></div><p class="muted">' + (t.rows < p.nk ? 'The first ' + t.rows + ' of ' + count(p.nk, 'row', 'rows') : p.nk === 1 ? 'The one row' : 'All ' + count(p.nk, 'row', 'rows')) +
    ' of ' + esc(t.memoryName) + '.</p>';
  box.innerHTML = html;
}

// ---- head summaries ----
function renderSummary() {
  const p = part();
  // One word per header, each defined by the note below and its title: the table fits a 360 px
  // screen on one header line (the browser test's headersFit checks 360 to 2560 px).
  const th = (word, title) => '<th title="' + title + '">' + word + '</th>';
  let html = '<tr><th class="label">head</th>' + th('entropy', 'mean entropy of a row\'s weights, in nats') +
    th('keys', 'effective keys: exp of the mean entropy') +
    (p.cross ? '' : th('distance', 'mean weight-averaged |j − i| from the row\'s diagonal')) +
    th('key&nbsp;0', 'mean weight on key 0') + th('max', 'mean largest weight of a row') + '</tr>';
  p.scans.forEach((s, h) => {
    html += '<tr class="head-row' + (h === state.head ? ' selected' : '') + '" data-head="' + h + '" tabindex="0">' +
      '<td class="label">' + h + '</td><td>' + fixed(s.meanEntropy, 3) + '</td><td>' + fixed(Math.exp(s.meanEntropy), 2) + '</td>' +
      (p.cross ? '' : '<td>' + fixed(s.meanDistance, 2) + '</td>') + '<td>' + fixed(s.meanFirstKey, 3) + '</td><td>' +
      fixed(s.meanMaxWeight, 3) + '</td></tr>';
  });
  $('summary').innerHTML = html;
  $('summary-note').textContent = 'Means over rows with an allowed key: entropy in nats over each row\'s weights; keys: ' +
    'the effective keys, exp of it' + (p.cross ? '' : '; distance: weight-averaged |j − i| from the row\'s diagonal') +
    '; key 0: the weight on key 0; max: the largest weight.' +
    (p.cross ? ' Queries and keys are different sequences here, so no distance is measured.' : '') +
    p.scans.map((s, h) => (s.noKeyRows ? ' ' + (p.heads > 1 ? 'Head ' + h + ': ' : '') + say('scan.rows', { rows: s.noKeyRows }) + '.' : '')).join('');
  for (const tr of $('summary').querySelectorAll('tr.head-row')) {
    tr.addEventListener('click', () => selectHead(+tr.dataset.head));
    tr.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') selectHead(+tr.dataset.head); });
  }
}
)JS";
}

}  // namespace qkv::explain_detail
