// test_hooks.cpp - see test_hooks.h (the test build only).
#include "test_hooks.h"

#include "sampling.h"

namespace es {

namespace {

class OracleDrafter : public DrafterBackend {
 public:
  OracleDrafter(OracleDrafts drafts, int prompt_len, int vocab)
      : d_(std::move(drafts)), prompt_len_(prompt_len), vocab_(vocab), rng_(7) {}

  void begin(int64_t position, const Masks&, int64_t) override {
    position_ = position;
    offset_ = 0;
  }

  DraftStep step(int64_t, const std::vector<float>& hidden) override {
    offset_ += 1;
    const int64_t pos = position_ + offset_;
    const int64_t i = pos - prompt_len_;
    int64_t tok = (i >= 0 && i < int64_t(d_.continuation.size())) ? d_.continuation[size_t(i)] : 4;
    if (wrong(pos)) tok = 4 + (tok + 1) % (vocab_ - 4);  // never equal to tok
    return DraftStep{{tok}, {1.0f}, hidden};
  }

 private:
  bool wrong(int64_t pos) {
    if (d_.wrong == "always") return true;
    if (d_.wrong == "third") return pos % 3 == 0;
    if (d_.wrong == "random") return rng_.random() < 0.4;
    return false;
  }
  OracleDrafts d_;
  int prompt_len_, vocab_;
  PortableRng rng_;
  int64_t position_ = 0, offset_ = 0;
};

}  // namespace

std::unique_ptr<DrafterBackend> make_oracle_drafter(const OracleDrafts& drafts, int prompt_len, int vocab) {
  return std::unique_ptr<DrafterBackend>(new OracleDrafter(drafts, prompt_len, vocab));
}

}  // namespace es
