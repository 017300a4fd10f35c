// The fixed parts of the explain page: its style sheet and its script, in pieces that
// html_page() joins in this order (the data block is separate; see page_data.h).
#pragma once

namespace qkv::explain_detail {

// A fully masked (not allowed) cell in every view, exact, pooled, zoomed and the SVG export: a
// neutral grey, unlike anything on the white-to-blue weight ramp (white is weight 0).
inline constexpr char kMaskedColour[] = "#a9acb3";

const char* page_style() noexcept;         // page_style.cc
const char* page_script_core() noexcept;   // page_script.cc: data, wording, colours, controls
const char* page_script_map() noexcept;    // page_map.cc: heatmap, mask pattern, keyboard
const char* page_script_row() noexcept;    // page_row.cc: a row's walk-through, stacked sum
const char* page_script_story() noexcept;  // page_story.cc: story, key/value rows, head table

// The colour of a weight relative to the largest in view (0..1), as "#rrggbb": one ramp for
// the page (mirrored in its script) and the SVG export.
void weight_colour(double fraction, char (&hex)[8]) noexcept;

}  // namespace qkv::explain_detail
