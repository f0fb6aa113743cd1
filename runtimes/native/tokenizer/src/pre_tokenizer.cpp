// pre_tokenizer.cpp - ByteLevel (GPT-2 regex + byte map), Digits, Split and Sequence pre-tokenizers.

#include <utility>

#include "components.h"
#include "es_tokenizer.h"
#include "unicode.h"
#include "utf8.h"

namespace es {

// ---- splitting behaviours, as tokenizers' NormalizedString::split applies them ----------------------

std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<Segment>& segments, SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const Segment& s : segments) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::Removed:
      for (const Segment& s : segments)
        if (!s.match) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::Contiguous: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.match && previous_match) out.back().second = s.end;
        else out.emplace_back(s.begin, s.end);
        previous_match = s.match;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.match && !previous_match && !out.empty()) out.back().second = s.end;
        else out.emplace_back(s.begin, s.end);
        previous_match = s.match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous_match = false;  // walking backwards: "previous" is the segment to the right
      for (size_t i = segments.size(); i-- > 0;) {
        const Segment& s = segments[i];
        if (s.match && !previous_match && !out.empty()) out.back().first = s.begin;
        else out.emplace_back(s.begin, s.end);
        previous_match = s.match;
      }
      std::vector<std::pair<size_t, size_t>> forward(out.rbegin(), out.rend());
      out.swap(forward);
      break;
    }
  }
  std::vector<std::pair<size_t, size_t>> kept;
  for (const auto& range : out)
    if (range.second > range.first) kept.push_back(range);
  return kept;
}

// ---- the GPT-2 byte map --------------------------------------------------------------------------

namespace {

struct ByteMap {
  std::string to_char[256];
  int from_char[324];  // mapped code points are < 256 + 68
  ByteMap() {
    for (int& b : from_char) b = -1;
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? char32_t(b) : char32_t(256 + extra++);
      to_char[b] = utf8::encode(cp);
      from_char[cp] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

const std::string& byte_to_char(unsigned char byte) { return byte_map().to_char[byte]; }

int char_to_byte(char32_t cp) { return cp < 324 ? byte_map().from_char[cp] : -1; }

// ---- the GPT-2 regex, by hand ------------------------------------------------------------------------

std::vector<Segment> gpt2_split(const std::string& text) {
  std::vector<char32_t> cps = utf8::decode(text);
  std::vector<size_t> offset(cps.size() + 1, text.size());
  for (size_t i = 0, byte = 0; i < cps.size(); ++i) {
    offset[i] = byte;
    byte += utf8::encode(cps[i]).size();
  }
  size_t n = cps.size();
  auto letter = [&](size_t i) { return i < n && unicode::is_letter(cps[i]); };
  auto number = [&](size_t i) { return i < n && unicode::is_number(cps[i]); };
  auto space = [&](size_t i) { return i < n && unicode::is_space(cps[i]); };
  auto other = [&](size_t i) { return i < n && !unicode::is_space(cps[i]) && !letter(i) && !number(i); };

  std::vector<Segment> segments;
  size_t i = 0;
  while (i < n) {
    size_t end = i;
    // 's|'t|'re|'ve|'m|'ll|'d
    if (cps[i] == '\'' && i + 1 < n) {
      char32_t a = cps[i + 1], b = i + 2 < n ? cps[i + 2] : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') end = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) end = i + 3;
    }
    if (end == i) {
      size_t start = cps[i] == ' ' ? i + 1 : i;  // the optional leading space
      if (letter(start)) {            // ' ?\p{L}+'
        end = start;
        while (letter(end)) ++end;
      } else if (number(start)) {     // ' ?\p{N}+'
        end = start;
        while (number(end)) ++end;
      } else if (other(start)) {      // ' ?[^\s\p{L}\p{N}]+'
        end = start;
        while (other(end)) ++end;
      } else {                        // '\s+(?!\S)|\s+'
        end = i;
        while (space(end)) ++end;
        if (end < n && end - i >= 2) --end;  // leave the last space to join the word that follows
      }
    }
    segments.push_back({offset[i], offset[end], true});
    i = end;
  }
  return segments;
}

// ---- the pre-tokenizer ---------------------------------------------------------------------------

static SplitBehavior behavior_of(const json::Value& config, const std::string& origin) {
  const json::Value* value = config.find("behavior");
  std::string name = value && value->type == json::Type::String ? value->string : "";
  if (name == "Removed") return SplitBehavior::Removed;
  if (name == "Isolated") return SplitBehavior::Isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (name == "Contiguous") return SplitBehavior::Contiguous;
  throw TokenizerError(origin + ": pre_tokenizer Split has an unknown behavior \"" + name + "\"");
}

static bool flag(const json::Value& config, const char* key, bool fallback) {
  const json::Value* value = config.find(key);
  return value && value->type == json::Type::Bool ? value->boolean : fallback;
}

void PreTokenizer::load(const json::Value& config, const std::string& origin) {
  if (!config.is_null()) add(config, origin);
}

void PreTokenizer::add(const json::Value& config, const std::string& origin) {
  const std::string& type = type_of(config, origin, "pre_tokenizer");
  Step step;
  if (type == "Sequence") {
    const json::Value* list = config.find("pretokenizers");
    if (list == nullptr || list->type != json::Type::Array)
      throw TokenizerError(origin + ": pre_tokenizer Sequence has no \"pretokenizers\" array");
    for (const json::Value& item : list->array) add(item, origin);
    return;
  } else if (type == "ByteLevel") {
    step.kind = Kind::ByteLevel;
    step.flag = flag(config, "use_regex", true);
    step.add_prefix_space = flag(config, "add_prefix_space", true);
  } else if (type == "Digits") {
    step.kind = Kind::Digits;
    step.flag = flag(config, "individual_digits", false);
  } else if (type == "Split") {
    step.kind = Kind::Split;
    step.pattern = string_pattern(config, origin, "pre_tokenizer Split");
    step.behavior = behavior_of(config, origin);
    if (flag(config, "invert", false)) unsupported(origin, "pre_tokenizer Split", "with invert=true", "invert=false");
  } else {
    unsupported(origin, "pre_tokenizer", "\"" + type + "\"", "ByteLevel, Digits, Split with a string pattern, Sequence");
  }
  steps_.push_back(step);
}

bool PreTokenizer::has_byte_level() const {
  for (const Step& step : steps_)
    if (step.kind == Kind::ByteLevel) return true;
  return false;
}

void PreTokenizer::run(const Step& step, const std::string& piece, std::vector<std::string>& out) const {
  std::vector<Segment> segments;
  SplitBehavior behavior = step.behavior;
  std::string text = piece;
  if (step.kind == Kind::ByteLevel) {
    if (step.add_prefix_space && text[0] != ' ') text = " " + text;
    if (step.flag) segments = gpt2_split(text);
    else segments.push_back({0, text.size(), false});
    behavior = SplitBehavior::Isolated;
  } else if (step.kind == Kind::Digits) {
    std::vector<char32_t> cps = utf8::decode(text);
    size_t byte = 0;
    for (char32_t cp : cps) {
      size_t length = utf8::encode(cp).size();
      segments.push_back({byte, byte + length, unicode::is_numeric(cp)});
      byte += length;
    }
    // merge neighbouring non-matches (they are one segment in tokenizers)
    std::vector<Segment> merged;
    for (const Segment& s : segments) {
      if (!s.match && !merged.empty() && !merged.back().match) merged.back().end = s.end;
      else merged.push_back(s);
    }
    segments.swap(merged);
    behavior = step.flag ? SplitBehavior::Isolated : SplitBehavior::Contiguous;
  } else {
    size_t pos = 0;
    while (true) {
      size_t hit = text.find(step.pattern, pos);
      if (hit == std::string::npos) break;
      if (hit > pos) segments.push_back({pos, hit, false});
      segments.push_back({hit, hit + step.pattern.size(), true});
      pos = hit + step.pattern.size();
    }
    if (pos < text.size()) segments.push_back({pos, text.size(), false});
  }
  for (const auto& range : apply_behavior(segments, behavior)) {
    std::string part = text.substr(range.first, range.second - range.first);
    if (step.kind == Kind::ByteLevel) {
      std::string mapped;
      for (unsigned char b : part) mapped += byte_to_char(b);
      part.swap(mapped);
    }
    out.push_back(std::move(part));
  }
}

std::vector<std::string> PreTokenizer::apply(const std::string& text) const {
  std::vector<std::string> pieces;
  if (!text.empty()) pieces.push_back(text);
  for (const Step& step : steps_) {
    std::vector<std::string> next;
    for (const std::string& piece : pieces) run(step, piece, next);
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace es
