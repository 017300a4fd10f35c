// The sentences explain says, in the terminal and on the page, and the rules that fill them.
#include "explain/wording.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace qkv::explain_detail {
namespace {

struct Phrase {
  std::string_view id;
  std::string_view text;
};

// Every sentence with a number in it that both the terminal and the page print.
constexpr Phrase kPhrases[] = {
    {"overview.sizes",
     "{nq|query|queries}, {nk|key|keys}, d_k = {d}, d_v = {dv}, {heads|head|heads}"},
    {"overview.kv_heads", " sharing {kv_heads|key/value head|key/value heads}"},
    {"overview.batch", "batch element {batch} of {batches}"},
    {"overview.batch_choice",
     "batch element {batch} of {batches} (--batch chooses another)"},
    {"overview.cross",
     "cross-attention: queries and keys are different sequences, so no distance |j - i| is "
     "measured"},
    {"overview.no_masking", "none (every query sees every key)"},
    {"scores.heaviest",
     "(the {shown} heaviest of {allowed|allowed key|allowed keys}; {hidden|other allowed key "
     "weighs|other allowed keys weigh} less: step 4 sums them)"},
    {"scores.left_out", "({masked|key is|keys are} not allowed for this query and left out)"},
    {"weights.heading",
     "weights w_{row}j = softmax(s)_j = exp(s_{row}j - lse), lse = {lse}; heaviest first"},
    {"weights.more", "({rest|more allowed key|more allowed keys})"},
    {"weights.more_sum", "{sum} in all"},
    {"weights.sink",
     "the sink (a logit of {sink} with no value) is one more term of the denominator: it takes "
     "{share} of it, so the weights sum to {sum}"},
    {"weights.none", "no key is allowed for this query: there are no weights, and O_{row} = 0"},
    {"weights.none_sink",
     "no key is allowed for this query: the sink takes everything, O_{row} = 0 and lse = the "
     "sink"},
    {"values.heading",
     "values v_j of the heaviest keys (V: another transform of the same key rows)"},
    {"output.sum", "O_{row} = Σ_j w_{row}j·v_j over the {allowed|allowed key|allowed keys}"},
    {"output.sum_all", "O_{row} = Σ_j w_{row}j·v_j over all {nk|key|keys}"},
    {"output.none", "O_{row} = 0: no key is allowed"},
    {"output.check",
     "(attention()'s output; Σ_j w_{row}j·v_j recomputed here agrees within {bound})"},
    {"entropy",
     "entropy {entropy} nats; effective number of keys exp(entropy) = {effective} of "
     "{allowed} allowed"},
    {"entropy.none", "no allowed key, so no entropy and no effective number of keys"},
    {"scan.rows", "{rows|row has|rows have} no allowed key"},
};

const std::string* find(const Values& values, std::string_view name) {
  for (const auto& [key, value] : values) {
    if (key == name) return &value;
  }
  return nullptr;
}

std::string json_escaped(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '<') {
      out += "\\u003c";  // no "</script>" can close the page's data block
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string say(std::string_view id, const Values& values) {
  const Phrase* phrase = nullptr;
  for (const Phrase& p : kPhrases) {
    if (p.id == id) phrase = &p;
  }
  if (phrase == nullptr) throw std::logic_error("explain: no phrase '" + std::string(id) + "'");
  const std::string_view text = phrase->text;
  std::string out;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t open = text.find('{', at);
    if (open == std::string_view::npos) {
      out += text.substr(at);
      break;
    }
    out += text.substr(at, open - at);
    const std::size_t close = text.find('}', open);
    const std::string_view field = text.substr(open + 1, close - open - 1);
    const std::size_t bar = field.find('|');
    const std::string_view name = field.substr(0, bar);
    const std::string* value = find(values, name);
    if (value == nullptr) {
      throw std::logic_error("explain: phrase '" + std::string(id) + "' needs {" +
                             std::string(name) + "}");
    }
    out += *value;
    if (bar != std::string_view::npos) {
      const std::string_view words = field.substr(bar + 1);
      const std::size_t second = words.find('|');
      out += ' ';
      out += *value == "1" ? words.substr(0, second) : words.substr(second + 1);
    }
    at = close + 1;
  }
  return out;
}

std::string phrases_json() {
  std::string json = "{";
  for (const Phrase& p : kPhrases) {
    if (json.size() > 1) json += ',';
    json += "\"" + json_escaped(p.id) + "\":\"" + json_escaped(p.text) + "\"";
  }
  return json + "}";
}

std::string fixed(double value, int digits) {
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  if (std::isnan(value)) return "nan";
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  // A negative value that rounds to zero prints as "-0.0000": drop the sign.
  if (text[0] == '-') {
    bool zero = true;
    for (const char* c = text + 1; *c != '\0'; ++c) zero = zero && (*c == '0' || *c == '.');
    if (zero) return text + 1;
  }
  return text;
}

std::string count(std::int64_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + " " + std::string(n == 1 ? one : many);
}

}  // namespace qkv::explain_detail
