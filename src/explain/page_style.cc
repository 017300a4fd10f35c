// The explain page's style sheet. The page is one column up to 1100 px wide and two columns
// past it; every wide thing (tables, maps, the stacked sum) scrolls inside its own box, so the
// page itself never scrolls sideways from 360 px to 2560 px.
#include "explain/page_script.h"

namespace qkv::explain_detail {

const char* page_style() noexcept {
  return R"CSS(
*, *::before, *::after { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d2433;
       background: #f6f7fb; overflow-wrap: anywhere; }
header { background: #12325e; color: #fff; padding: 12px 16px; }
header h1 { font-size: 18px; margin: 0 0 4px; }
header p { margin: 0; opacity: .9; }
header .muted { color: #d5def0; }
#part-facts { white-space: pre-line; }
main { display: grid; grid-template-columns: minmax(0, 1fr); gap: 14px; padding: 14px 12px;
       max-width: 2400px; margin: 0 auto; }
@media (min-width: 1100px) {
  main { grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); padding: 16px 20px; }
  #story { grid-column: 1 / -1; }
}
main > div { display: flex; flex-direction: column; gap: 14px; min-width: 0; }
section { background: #fff; border: 1px solid #dde2ec; border-radius: 6px; padding: 12px 14px;
          min-width: 0; }
h2 { font-size: 15px; margin: 0 0 8px; }
h3 { font-size: 14px; margin: 12px 0 6px; }
.controls { display: flex; gap: 8px 14px; align-items: center; flex-wrap: wrap; margin-bottom: 8px; }
.controls label { white-space: nowrap; }
.muted { color: #5d6675; font-size: 12px; }
.note { background: #fff8e6; border-left: 3px solid #e0a800; padding: 4px 8px; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 2px 8px; text-align: right; border-bottom: 1px solid #eef0f5; white-space: nowrap; }
th { font-weight: 600; color: #44506a; }
td.label, th.label { text-align: left; }
th.group { text-align: center; border-bottom: 2px solid #c9d2e3; }
#summary th { vertical-align: bottom; }  /* one word each: one line from 360 px up */
@media (max-width: 420px) {
  #summary { font-size: 12px; }
  #summary th, #summary td { padding: 2px 3px; }
}
#summary tr.head-row { cursor: pointer; }
#summary tr.selected { background: #e7efff; }
#heatmap { position: relative; min-height: 80px; max-width: 100%; overflow-x: auto; outline: none; }
#heatmap:focus-visible { box-shadow: 0 0 0 3px #7aa7e6; border-radius: 4px; }
.map-wrap { position: relative; display: inline-block; }
#heatmap canvas { image-rendering: pixelated; cursor: zoom-in; position: absolute; }
#heatmap.sampled canvas { cursor: pointer; }
#heatmap svg rect.cell { cursor: pointer; }
#heatmap svg rect.cell:hover { stroke: #e4572e; stroke-width: 2; }
.row-highlight { position: absolute; pointer-events: none; border: 2px solid #e4572e;
                 box-shadow: 0 0 0 1px #fff; }
.map-cursor { position: absolute; pointer-events: none; border: 2px dashed #111;
              box-shadow: 0 0 0 1px #fff; }
.legend { margin: 6px 0; max-width: 100%; overflow-x: auto; }
.legend svg { display: block; }
#mask canvas { image-rendering: pixelated; border: 1px solid #ccd3e0; max-width: 100%; }
#tip { position: fixed; pointer-events: none; background: #1d2433; color: #fff; padding: 6px 8px;
       border-radius: 4px; font-size: 12px; white-space: pre; display: none; z-index: 10; }
.bar { display: inline-block; height: 11px; background: #2171b5; vertical-align: middle; }
table.vec { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; margin: 4px 0; }
table.vec th { font-family: system-ui, sans-serif; font-weight: 500; font-size: 11px; }
ol.steps { padding-left: 22px; }
ol.steps > li { margin-bottom: 12px; }
details { margin-top: 8px; }
button, select, input { font: inherit; }
#row-input { width: 7em; }
.flow { font-family: ui-monospace, "DejaVu Sans Mono", monospace; background: #f3f5fa;
        padding: 6px 10px; border-radius: 4px; display: inline-block; }
.sr-status { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); }
#stacked-sum text { font-size: 11px; }
)CSS";
}

}  // namespace qkv::explain_detail
