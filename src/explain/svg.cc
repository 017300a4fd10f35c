// One head's heatmap as a standalone SVG for papers and slides: rects coloured by weight
// (pooled by max over blocks when the input is larger than max_side), labels when few enough.
#include <algorithm>
#include <cstdio>
#include <string>

#include "explain/page_script.h"
#include "qkv/explain.h"

namespace qkv {
namespace {

std::string escape_xml(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string fixed(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", value);
  return text;
}

}  // namespace

std::string heatmap_svg(const Explanation& e, std::int64_t head, std::int64_t max_side) {
  const HeadScan scan = scan_head(e, head, max_side);
  const std::int64_t rows = scan.map_rows, cols = scan.map_cols;
  const bool labelled = rows == e.nq && cols == e.nk && rows <= 40 && cols <= 40;
  const std::int64_t cell =
      std::clamp<std::int64_t>(640 / std::max<std::int64_t>(rows, cols), 2, 40);
  const std::int64_t left = labelled ? 120 : 16, top = labelled ? 100 : 40;
  // Wide enough for the caption and the legend's text even when the map is narrow.
  const std::int64_t width = std::max(left + cols * cell + 16, left + 600);
  const std::int64_t height = top + rows * cell + 56;
  float max = 0.0f;
  for (const float w : scan.max_weight) max = std::max(max, w);

  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) +
         "\" height=\"" + std::to_string(height) +
         "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  std::string caption = "head " + std::to_string(head) + ": weights w_ij, " + std::to_string(e.nq) +
                        " queries x " + std::to_string(e.nk) + " keys";
  if (rows != e.nq || cols != e.nk)
    caption += " (max-pooled to " + std::to_string(rows) + " x " + std::to_string(cols) + ")";
  svg += "<text x=\"16\" y=\"" + std::to_string(labelled ? 16 : 24) + "\" font-size=\"13\">" +
         escape_xml(caption) + "</text>\n";
  for (std::int64_t a = 0; a < rows; ++a) {
    for (std::int64_t b = 0; b < cols; ++b) {
      const auto at = static_cast<std::size_t>(a * cols + b);
      char colour[8];
      explain_detail::weight_colour(max > 0 ? scan.max_weight[at] / max : 0.0, colour);
      const bool forbidden = scan.allowed_share[at] == 0.0f;
      svg += "<rect x=\"" + std::to_string(left + b * cell) + "\" y=\"" +
             std::to_string(top + a * cell) + "\" width=\"" + std::to_string(cell) +
             "\" height=\"" + std::to_string(cell) + "\" fill=\"" +
             (forbidden ? std::string("#e9ebf0") : std::string(colour)) + "\"/>\n";
    }
  }
  if (labelled) {
    for (std::int64_t a = 0; a < rows; ++a) {
      svg += "<text x=\"" + std::to_string(left - 4) + "\" y=\"" +
             std::to_string(top + a * cell + cell / 2 + 4) + "\" text-anchor=\"end\">" +
             escape_xml(e.query_labels[static_cast<std::size_t>(a)]) + "</text>\n";
    }
    for (std::int64_t b = 0; b < cols; ++b) {
      const std::int64_t x = left + b * cell + cell / 2, y = top - 4;
      svg += "<text x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) +
             "\" transform=\"rotate(-45 " + std::to_string(x) + " " + std::to_string(y) + ")\">" +
             escape_xml(e.key_labels[static_cast<std::size_t>(b)]) + "</text>\n";
    }
  }
  // A legend: the ramp from 0 to the largest weight shown.
  const std::int64_t legend_y = top + rows * cell + 16;
  for (int s = 0; s < 10; ++s) {
    char colour[8];
    explain_detail::weight_colour(s / 9.0, colour);
    svg += "<rect x=\"" + std::to_string(left + s * 16) + "\" y=\"" + std::to_string(legend_y) +
           "\" width=\"16\" height=\"10\" fill=\"" + colour + "\"/>\n";
  }
  svg += "<text x=\"" + std::to_string(left + 168) + "\" y=\"" + std::to_string(legend_y + 9) +
         "\">0 to " + fixed(max) + " (queries down, keys across; grey: not allowed)</text>\n";
  return svg + "</svg>\n";
}

}  // namespace qkv
