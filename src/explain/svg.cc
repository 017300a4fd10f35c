// One head's heatmap as a standalone SVG for papers and slides: rects coloured by weight
// (pooled by max over blocks when the input is larger than max_side), labels when few enough,
// index ticks otherwise, and a legend group. Masked cells are the page's masked grey; a pooled
// cell partly masked blends with it by its allowed share, as on the page.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "explain/page_script.h"
#include "explain/wording.h"
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

// `weight` (hex "#rrggbb") mixed with the masked grey: share 1 is the weight's colour.
std::string blend(const char* weight, double share) {
  unsigned a[3], m[3];
  std::sscanf(weight, "#%02x%02x%02x", &a[0], &a[1], &a[2]);
  std::sscanf(explain_detail::kMaskedColour, "#%02x%02x%02x", &m[0], &m[1], &m[2]);
  char hex[8];
  int rgb[3];
  for (int c = 0; c < 3; ++c) {
    rgb[c] = static_cast<int>(std::lround(a[c] * share + m[c] * (1.0 - share)));
  }
  std::snprintf(hex, sizeof hex, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
  return hex;
}

// The smallest step of 1, 2 or 5 x 10^k indices whose spacing on screen holds a label.
std::int64_t tick_step(double pixels_per_index, double label_pixels) {
  for (std::int64_t k = 1;; k *= 10) {
    for (const std::int64_t m : {1, 2, 5}) {
      if (static_cast<double>(m * k) * pixels_per_index >= label_pixels) return m * k;
    }
  }
}

std::string text_at(std::int64_t x, std::int64_t y, const std::string& anchor,
                    const std::string& text, const std::string& extra = "") {
  return "<text x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) + "\" text-anchor=\"" +
         anchor + "\"" + extra + ">" + escape_xml(text) + "</text>\n";
}

}  // namespace

std::string heatmap_svg(const Explanation& e, std::int64_t head, std::int64_t max_side) {
  const HeadScan scan = scan_head(e, head, max_side);
  const std::int64_t rows = scan.map_rows, cols = scan.map_cols;
  const bool labelled = rows == e.nq && cols == e.nk && rows <= 40 && cols <= 40;
  const std::int64_t cell =
      std::clamp<std::int64_t>(640 / std::max<std::int64_t>(rows, cols), 2, 40);
  const std::int64_t left = labelled ? 120 : 48, top = labelled ? 100 : 48;
  // Wide enough for the caption and the legend's text even when the map is narrow.
  const std::int64_t width = std::max(left + cols * cell + 16, left + 600);
  const std::int64_t height = top + rows * cell + 60;
  float max = 0.0f;
  for (const float w : scan.max_weight) max = std::max(max, w);

  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) +
         "\" height=\"" + std::to_string(height) +
         "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  std::string caption = "head " + std::to_string(head) + ": weights w_ij, " +
                        explain_detail::count(e.nq, "query", "queries") + " x " +
                        explain_detail::count(e.nk, "key", "keys");
  if (rows != e.nq || cols != e.nk)
    caption += " (max-pooled to " + std::to_string(rows) + " x " + std::to_string(cols) + ")";
  svg += text_at(16, labelled ? 16 : 20, "start", caption, " font-size=\"13\"");
  for (std::int64_t a = 0; a < rows; ++a) {
    for (std::int64_t b = 0; b < cols; ++b) {
      const auto at = static_cast<std::size_t>(a * cols + b);
      char colour[8];
      explain_detail::weight_colour(max > 0 ? scan.max_weight[at] / max : 0.0, colour);
      const double share = scan.allowed_share[at];
      svg += "<rect class=\"" + std::string(share == 0.0 ? "cell masked" : "cell") + "\" x=\"" +
             std::to_string(left + b * cell) + "\" y=\"" + std::to_string(top + a * cell) +
             "\" width=\"" + std::to_string(cell) + "\" height=\"" + std::to_string(cell) +
             "\" fill=\"" + (share >= 1.0 ? std::string(colour) : blend(colour, share)) + "\"/>\n";
    }
  }
  if (labelled) {
    // Names at a step that keeps them apart (rows 13 px of text, columns at 45 degrees).
    const std::int64_t row_step = tick_step(static_cast<double>(cell), 13);
    const std::int64_t col_step = tick_step(static_cast<double>(cell), 15);
    for (std::int64_t a = 0; a < rows; a += row_step) {
      svg += text_at(left - 4, top + a * cell + cell / 2 + 4, "end",
                     e.query_labels[static_cast<std::size_t>(a)]);
    }
    for (std::int64_t b = 0; b < cols; b += col_step) {
      const std::int64_t x = left + b * cell + cell / 2, y = top - 4;
      svg +=
          text_at(x, y, "start", e.key_labels[static_cast<std::size_t>(b)],
                  " transform=\"rotate(-45 " + std::to_string(x) + " " + std::to_string(y) + ")\"");
    }
  } else {
    // Index ticks: query and key indices (not pooled cells), spaced so that they never collide.
    const double row_px = static_cast<double>(rows * cell) / static_cast<double>(e.nq);
    const double col_px = static_cast<double>(cols * cell) / static_cast<double>(e.nk);
    const double digits = static_cast<double>(std::to_string(e.nk).size());
    const std::int64_t row_step = tick_step(row_px, 14),
                       col_step = tick_step(col_px, 7 * digits + 10);
    for (std::int64_t i = 0; i < e.nq; i += row_step) {
      svg += text_at(left - 4,
                     top + static_cast<std::int64_t>((static_cast<double>(i) + 0.5) * row_px) + 4,
                     "end", std::to_string(i));
    }
    for (std::int64_t j = 0; j < e.nk; j += col_step) {
      svg += text_at(left + static_cast<std::int64_t>((static_cast<double>(j) + 0.5) * col_px),
                     top - 6, "middle", std::to_string(j));
    }
  }
  // The legend: the ramp from 0 to the largest weight shown, and the masked grey when masked.
  const std::int64_t legend_y = top + rows * cell + 16;
  svg += "<g class=\"legend\">\n";
  for (int s = 0; s < 10; ++s) {
    char colour[8];
    explain_detail::weight_colour(s / 9.0, colour);
    svg += "<rect x=\"" + std::to_string(left + s * 16) + "\" y=\"" + std::to_string(legend_y) +
           "\" width=\"16\" height=\"10\" fill=\"" + colour + "\"/>\n";
  }
  svg += text_at(left, legend_y + 22, "start", "0");
  svg += text_at(left + 160, legend_y + 22, "end", explain_detail::fixed(max, 4));
  svg += text_at(left + 168, legend_y + 9, "start",
                 "weight, linear from 0 to the largest in the map (queries down, keys across)");
  if (e.masked()) {
    svg += "<rect x=\"" + std::to_string(left + 168) + "\" y=\"" + std::to_string(legend_y + 14) +
           "\" width=\"16\" height=\"10\" fill=\"" + explain_detail::kMaskedColour + "\"/>\n";
    svg += text_at(left + 190, legend_y + 23, "start",
                   "not allowed (masked); a pooled cell partly allowed is in between");
  }
  svg += "</g>\n";
  return svg + "</svg>\n";
}

}  // namespace qkv
