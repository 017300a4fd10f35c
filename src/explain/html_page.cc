// The self-contained explain page: markup, style, script and data in one file.
//
// The data block (page_data.cc) holds, per explained part, either what the page needs to
// recompute any row exactly or precomputed walk-throughs of sampled rows, whichever fits the
// page's byte budget, and the pooled overview maps; the phrase table (wording.cc) lets the page
// say every sentence exactly as the terminal does. Nothing is fetched: a Content-Security-Policy
// forbids every request.
#include <string>

#include "explain/page_data.h"
#include "explain/page_script.h"
#include "explain/wording.h"
#include "qkv/explain.h"

namespace qkv {
namespace {

// The markup the script fills. The ids and classes are the page's contract with its browser
// tests (tests/browser).
constexpr const char kBody[] =
    R"HTML(<header><h1>qkv explain: query, key and value, step by step</h1>
<p id="part-title"></p><p id="mode-note" class="muted"></p></header>
<main>
<section id="story" hidden></section>
<div>
<section><div class="controls">
<label id="part-box">Part <select id="part"></select></label>
<label id="batch-box">Batch <select id="batch"></select></label>
<label>Head <select id="head"></select></label>
<label>Colour scale <select id="scale"><option value="row">per row</option><option value="global">global</option></select></label>
<label>Colours <select id="colour"><option value="linear">linear</option><option value="log">log (6 decades)</option></select></label>
<label>Pooling <select id="pooling"><option value="max">max</option><option value="mean">mean</option></select></label>
<button id="back">Back to overview</button></div>
<p class="muted" id="batch-note"></p>
<p class="muted" id="part-facts"></p>
<div id="heatmap" role="application" aria-roledescription="attention heatmap" aria-label="attention weights" tabindex="0"></div>
<div id="heatmap-legend" class="legend" role="img" aria-label="colour scale"></div>
<p class="muted" id="view-note"></p>
<p id="heatmap-status" class="sr-status" aria-live="polite"></p>
</section>
<section><h2>Mask pattern</h2><div id="mask"></div>
<div id="mask-legend" class="legend" role="img" aria-label="mask legend"></div></section>
</div>
<div>
<section><h2>Heads</h2><div class="scroll"><table id="summary"></table></div>
<p class="muted" id="summary-note"></p></section>
<section><div class="controls"><label>Row <input id="row-input" type="number" min="0" value="0"></label>
<button id="row-go">Walk through</button></div><div id="row"></div></section>
</div>
</main>
<div id="tip"></div>
)HTML";

}  // namespace

std::string html_page(const std::vector<Explanation>& parts,
                      const std::vector<std::vector<HeadScan>>& scans, const PageView& open) {
  std::string data = explain_detail::page_data_json(parts, scans, open);
  data.pop_back();  // the closing brace: the phrases and the masked colour join the same object
  data += ",\"phrases\":" + explain_detail::phrases_json() + ",\"maskedColour\":\"" +
          explain_detail::kMaskedColour + "\"}";
  std::string page =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>qkv explain</title>\n<style>";
  page += explain_detail::page_style();
  page += "</style>\n</head>\n<body>\n";
  page += kBody;
  page += "<script type=\"application/json\" id=\"qkv-data\">";
  page += data;
  page += "</script>\n<script>";
  for (const char* piece :
       {explain_detail::page_script_core(), explain_detail::page_script_map(),
        explain_detail::page_script_row(), explain_detail::page_script_story()}) {
    page += piece;
  }
  page += "init();\n</script>\n</body>\n</html>\n";
  return page;
}

}  // namespace qkv
