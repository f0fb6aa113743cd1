// eagle3.cpp - see eagle3.h. Line by line runtimes/ort_eagle3.py (AuxRecord, OrtEagle3Drafter.begin / step).
#include "eagle3.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "errors.h"

namespace es {

AuxRecord::AuxRecord(int max_context, int w)
    : width(w), ids(size_t(max_context), -1), aux(size_t(max_context) * size_t(w), 0.0f) {}

void AuxRecord::record(const int64_t* tokens, const int64_t* positions, const float* rows, int t) {
  for (int i = 0; i < t; ++i) {
    const int64_t p = positions[i];
    if (p < 0 || p >= int64_t(ids.size())) continue;  // a dummy row past the context
    ids[size_t(p)] = tokens[i];
    std::memcpy(aux.data() + size_t(p) * size_t(width), rows + size_t(i) * size_t(width), sizeof(float) * size_t(width));
  }
}

void Eagle3Rows::check_room(const Rows& rows, int64_t slots) {
  const int64_t t = int64_t(rows.ids.size());
  if (rows.s + t > slots)
    throw kv_state_error("the eagle3 drafter's cache holds " + std::to_string(slots) + " rows, a step would write rows " +
                             std::to_string(rows.s + 1) + ".." + std::to_string(rows.s + t),
                         "draft fewer tokens (--spec-k) or generate fewer (--max-new-tokens)");
}

Eagle3Rows::Eagle3Rows(const AuxRecord& record, int capacity) : record_(record), tokens_(size_t(capacity) + 1, -1) {}

void Eagle3Rows::begin(int64_t position) {
  const int64_t keep = std::min(committed_, position - 1);
  int64_t differs = -1;  // the first position 0..keep whose token changed since its row was computed
  for (int64_t p = 0; p <= keep && differs < 0; ++p)
    if (tokens_[size_t(p)] != record_.ids[size_t(p)]) differs = p;
  // a token differing at position j stales the rows j.. (token 0 too: every row's aux states read it)
  committed_ = differs < 0 ? keep : std::max<int64_t>(differs - 1, 0);
  used_ = committed_;
  position_ = position;
  fresh_ = true;
}

Eagle3Rows::Rows Eagle3Rows::next(int64_t token) {
  Rows r;
  r.first = fresh_;
  fresh_ = false;
  r.s = used_;
  if (r.first) {  // the missing rows c + 1..L: target aux [c, L), tokens c + 1..L (token L: this step's)
    r.aux_from = committed_;
    r.ids.assign(record_.ids.begin() + committed_ + 1, record_.ids.begin() + position_);
  }
  r.ids.push_back(token);
  return r;
}

void Eagle3Rows::wrote(const Rows& r) {
  const int64_t t = int64_t(r.ids.size());
  used_ += t;
  if (r.first) {
    tokens_[0] = record_.ids[0];
    std::copy(r.ids.begin(), r.ids.end(), tokens_.begin() + r.s + 1);  // rows at positions s + 1..s + t
    committed_ = used_;
  }
}

}  // namespace es
