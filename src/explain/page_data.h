// The explain page's data block: what each part embeds, chosen by a byte budget.
#pragma once

#include <string>
#include <vector>

#include "qkv/explain.h"

namespace qkv::explain_detail {

// {"parts":[...],"open":{...},"budget":...} without the phrases (html_page adds those).
std::string page_data_json(const std::vector<Explanation>& parts,
                           const std::vector<std::vector<HeadScan>>& scans, const PageView& open);

}  // namespace qkv::explain_detail
