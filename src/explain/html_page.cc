// The self-contained explain page: markup, style, script and data in one file.
//
// The data block holds, per explained part and head, what the page needs to recompute any row
// or zoomed block exactly (Q and K in float64, the lse attention() returned, the mask's values
// when they fit) and the pooled overview scan_head() made; V and O go as float32, for display.
// Arrays are little-endian bytes in base64, read back as JS typed arrays. Nothing is fetched:
// a Content-Security-Policy forbids every request.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "explain/page_script.h"
#include "qkv/explain.h"

namespace qkv {
namespace {

// Mask values are embedded (float64) up to this many; past it the page shows pooled maps only.
constexpr std::int64_t kMaxMaskValues = std::int64_t{1} << 21;
// V and O are embedded in float64 up to this many values per head, float32 past it.
constexpr std::int64_t kMaxExactValues = std::int64_t{1} << 18;
// Samples x_i are embedded up to this many values.
constexpr std::int64_t kMaxSampleValues = std::int64_t{1} << 20;

std::string base64(const void* data, std::size_t size) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < size; i += 3) {
    const unsigned v = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < size) {
    const unsigned v = (bytes[i] << 16) | (i + 1 < size ? bytes[i + 1] << 8 : 0u);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < size ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string b64_f64(const std::vector<double>& values) {
  return base64(values.data(), values.size() * sizeof(double));
}

std::string b64_f32(const std::vector<double>& values) {
  const std::vector<float> narrow(values.begin(), values.end());
  return base64(narrow.data(), narrow.size() * sizeof(float));
}

// A JSON string, safe inside <script>: '<' is escaped so that no "</script>" can close it.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '<') {
      out += "\\u003c";
    } else if (u < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", u);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::string json_int(std::int64_t value) { return std::to_string(value); }

std::string json_strings(const std::vector<std::string>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    out += json_string(values[i]);
  }
  return out + "]";
}

// Labels only when some differ from the row numbers the page would show anyway.
std::string json_labels(const std::vector<std::string>& labels) {
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != std::to_string(i)) return json_strings(labels);
  }
  return "null";
}

template <typename Each>
std::string json_array(std::size_t count, Each each) {
  std::string out = "[";
  for (std::size_t i = 0; i < count; ++i) {
    out += i ? ",\"" : "\"";
    out += each(i);
    out += '"';
  }
  return out + "]";
}

std::string masking_text(const Explanation& e) {
  std::vector<std::string> rules;
  if (e.causal) rules.push_back("causal");
  if (e.window) {
    rules.push_back("window " + std::to_string(e.window->left) + "," +
                    std::to_string(e.window->right));
  }
  if (!e.mask_name.empty()) rules.push_back("mask " + e.mask_name);
  std::string text;
  for (const std::string& rule : rules) {
    if (!text.empty()) text += " + ";
    text += rule;
  }
  return text;
}

std::string scan_json(const HeadScan& s) {
  std::vector<unsigned char> allowed(s.allowed_share.size());
  for (std::size_t c = 0; c < allowed.size(); ++c) {
    allowed[c] = static_cast<unsigned char>(std::lround(s.allowed_share[c] * 255.0f));
  }
  return "{\"mapRows\":" + json_int(s.map_rows) + ",\"mapCols\":" + json_int(s.map_cols) +
         ",\"maxWeight\":[\"" + base64(s.max_weight.data(), s.max_weight.size() * sizeof(float)) +
         "\"],\"allowed\":[\"" + base64(allowed.data(), allowed.size()) +
         "\"],\"meanEntropy\":" + json_number(s.mean_entropy) +
         ",\"meanDistance\":" + json_number(s.mean_distance) +
         ",\"meanFirstKey\":" + json_number(s.mean_first_key) +
         ",\"meanMaxWeight\":" + json_number(s.mean_max_weight) +
         ",\"mostFocused\":" + json_int(s.most_focused) +
         ",\"leastFocused\":" + json_int(s.least_focused) + "}";
}

std::string part_json(const Explanation& e, const std::vector<HeadScan>& scans) {
  const auto heads = static_cast<std::size_t>(e.heads);
  const auto kv_heads = static_cast<std::size_t>(e.kv_heads);
  std::string facts = format_overview(e);
  if (!e.title.empty()) facts = facts.substr(e.title.size() + 1);
  std::string j = "{";
  j += "\"title\":" + json_string(e.title.empty() ? "qkv explain" : e.title);
  j += ",\"short\":" + json_string(e.title.substr(0, e.title.find(':')));
  j += ",\"facts\":" + json_string(facts);
  j += ",\"nq\":" + json_int(e.nq) + ",\"nk\":" + json_int(e.nk) + ",\"d\":" + json_int(e.d) +
       ",\"dv\":" + json_int(e.dv) + ",\"heads\":" + json_int(e.heads) +
       ",\"kvHeads\":" + json_int(e.kv_heads) + ",\"scale\":" + json_number(e.scale);
  j += std::string(",\"causal\":") + (e.causal ? "true" : "false");
  j += ",\"window\":" +
       (e.window ? "[" + json_int(e.window->left) + "," + json_int(e.window->right) + "]"
                 : std::string("null"));
  j += ",\"softcap\":" + json_number(e.softcap);
  const auto per_head = [&](const std::vector<double>& values) {
    std::string a = "[";
    for (std::size_t h = 0; h < values.size(); ++h) a += (h ? "," : "") + json_number(values[h]);
    return a + "]";
  };
  j += ",\"alibi\":" + (e.alibi_slopes.empty() ? std::string("null") : per_head(e.alibi_slopes));
  j += ",\"sinks\":" + (e.sinks.empty() ? std::string("null") : per_head(e.sinks));
  j += std::string(",\"masked\":") + (e.masked() ? "true" : "false");
  j += ",\"maskText\":" + json_string(masking_text(e));
  if (!e.mask_name.empty()) {
    const std::int64_t copies = e.mask_varies_by_head ? e.heads : 1;
    if (copies * e.nq * e.nk <= kMaxMaskValues) {
      j += std::string(",\"maskPerHead\":") + (e.mask_varies_by_head ? "true" : "false");
      j += ",\"maskBias\":" + json_array(static_cast<std::size_t>(copies), [&](std::size_t h) {
             std::vector<double> bias(static_cast<std::size_t>(e.nq * e.nk));
             for (std::int64_t i = 0; i < e.nq; ++i) {
               for (std::int64_t k = 0; k < e.nk; ++k) {
                 bias[static_cast<std::size_t>(i * e.nk + k)] =
                     e.bias(static_cast<std::int64_t>(h), i, k);
               }
             }
             return b64_f64(bias);
           });
    } else {
      j += ",\"maskTooLarge\":true";
    }
  }
  j += ",\"queryLabels\":" + json_labels(e.query_labels);
  j += ",\"keyLabels\":" + json_labels(e.key_labels);
  j += ",\"q\":" + json_array(heads, [&](std::size_t h) { return b64_f64(e.q[h].values); });
  j += ",\"k\":" + json_array(kv_heads, [&](std::size_t h) { return b64_f64(e.k[h].values); });
  // V and O are for display: exact when small, float32 (7 digits) past kMaxExactValues.
  const bool exact_values = std::max(e.nk, e.nq) * e.dv <= kMaxExactValues;
  const auto values = exact_values ? b64_f64 : b64_f32;
  j += std::string(",\"valuesF64\":") + (exact_values ? "true" : "false");
  j += ",\"v\":" + json_array(kv_heads, [&](std::size_t h) { return values(e.v[h].values); });
  j += ",\"out\":" + json_array(heads, [&](std::size_t h) { return values(e.out[h].values); });
  j += ",\"lse\":" + json_array(heads, [&](std::size_t h) { return b64_f64(e.lse[h]); });
  if (e.projection && e.projection->x.rows * e.projection->x.cols <= kMaxSampleValues) {
    j += ",\"x\":" + json_array(1, [&](std::size_t) { return b64_f64(e.projection->x.values); });
    j += ",\"dx\":" + json_int(e.projection->x.cols);
    j += ",\"xName\":" + json_string(e.projection->x_name);
  }
  j += ",\"scans\":[";
  for (std::size_t h = 0; h < scans.size(); ++h) {
    if (h) j += ',';
    j += scan_json(scans[h]);
  }
  return j + "]}";
}

}  // namespace

std::string html_page(const std::vector<Explanation>& parts,
                      const std::vector<std::vector<HeadScan>>& scans, const PageView& /*open*/) {
  std::string page =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>qkv explain</title>\n<style>";
  page += explain_detail::page_style();
  page +=
      "</style>\n</head>\n<body>\n"
      "<header><h1>qkv explain: query, key and value, step by step</h1>"
      "<p id=\"part-title\"></p></header>\n<main>\n<div>\n"
      "<section><div class=\"controls\"><span id=\"part-box\"><select id=\"part\"></select>"
      "</span><label>Head <select id=\"head\"></select></label>"
      "<button id=\"back\">Back to overview</button></div>"
      "<p class=\"muted\" id=\"part-facts\"></p>"
      "<div id=\"heatmap\"></div><p class=\"muted\" id=\"view-note\"></p></section>\n"
      "<section><h2>Mask pattern</h2><div id=\"mask\"></div></section>\n</div>\n<div>\n"
      "<section><h2>Heads</h2><table id=\"summary\"></table>"
      "<p class=\"muted\">Entropy in nats over each row's weights (effective keys = exp of it); "
      "distance: weight-averaged |j − i| from the row's diagonal; means over rows with a "
      "key.</p></section>\n"
      "<section><div class=\"controls\"><label>Row <input id=\"row-input\" type=\"number\" "
      "min=\"0\" value=\"0\"></label><button id=\"row-go\">Walk through</button></div>"
      "<div id=\"row\"></div></section>\n</div>\n</main>\n<div id=\"tip\"></div>\n"
      "<script type=\"application/json\" id=\"qkv-data\">{\"parts\":[";
  for (std::size_t n = 0; n < parts.size(); ++n) {
    if (n) page += ',';
    page += part_json(parts[n], scans[n]);
  }
  page += "]}</script>\n<script>";
  page += explain_detail::page_script();
  page += "</script>\n</body>\n</html>\n";
  return page;
}

}  // namespace qkv
