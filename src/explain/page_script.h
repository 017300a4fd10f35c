// The fixed parts of the explain page: its style sheet and its script (the data is separate).
#pragma once

namespace qkv::explain_detail {

const char* page_style() noexcept;
const char* page_script() noexcept;

// The colour of a weight relative to the largest in view (0..1), as "#rrggbb": one ramp for
// the page (mirrored in its script) and the SVG export.
void weight_colour(double fraction, char (&hex)[8]) noexcept;

}  // namespace qkv::explain_detail
