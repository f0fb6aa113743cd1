// fixed_eagle3.h - an EAGLE-3 drafter over fixed-shape graphs, runtime-neutral: a port of runtimes/fixed_eagle3.py
// FixedEagle3Drafter (which rows a step runs: eagle3.h). A backend hands it two callables that run one step graph and
// one fc graph of a given length on its own runtime (qnn_backend.cpp: onnxruntime sessions on the HTP or the CPU);
// this file pads, masks, chunks and keeps the drafter's own cache.
//
//   * lengths: the step and fc graphs exist at the target's pass lengths; a step of t rows runs the smallest
//     T >= t, and a burst's first step longer than the longest T runs in chunks of it (each chunk's rows written
//     before the next chunk reads them);
//   * padding: a step is padded at the FRONT (the graph returns the last row's candidates, which must be a real
//     row): T - t pad rows repeat the first real row's token, hidden and position and see only the written slots
//     and themselves (front_pad_mask); no real row sees a pad row and none is written to the cache. fc is row by
//     row: its pad rows are zeros at the end, dropped;
//   * its own cache: [1, H_kv, S, D] float32 per drafter layer (S: the draft layout's max_context; slot p - 1 =
//     position p), passed whole to every call; each step's real new rows are written after the s written ones.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend.h"
#include "eagle3.h"
#include "kv.h"

namespace es {

// runtimes/fixed_eagle3.py front_pad_mask: [n, slots + n] additive, n - t pad rows then t real rows after s written
// slots. Every row sees slots [0, s); real row i (graph row p + i, p = n - t) sees new rows p..p + i; pad row j sees
// itself; hidden entries hold `floor` (a quantized graph's mask input has a calibrated range).
std::vector<float> front_pad_mask(int64_t s, int t, int n, int slots, float floor);

// One call of a step graph of length n: its inputs, and the buffers its outputs go to (sized by the drafter).
struct Eagle3StepCall {
  int n = 0;
  const int32_t* ids = nullptr;        // input_ids [1, n]
  const float* hidden = nullptr;       // hidden [1, n, H]
  const int32_t* positions = nullptr;  // position_ids [1, n]
  const float* mask = nullptr;         // draft_mask [1, 1, n, S + n]
  std::vector<std::vector<float>>* k = nullptr;  // per drafter layer [1, H_kv, S, D] (read only)
  std::vector<std::vector<float>>* v = nullptr;
  int32_t* token_ids = nullptr;   // draft_token_ids [Vd] (target ids)
  float* logits = nullptr;        // draft_logits [Vd]
  float* out_hidden = nullptr;    // draft_hidden [1, 1, H] (the last row's)
  std::vector<std::vector<float>>* k_new = nullptr;  // per drafter layer [1, H_kv, n, D]
  std::vector<std::vector<float>>* v_new = nullptr;
};

struct FixedEagle3Graphs {
  std::vector<int> lengths;  // the graphs' pass lengths, ascending (step and fc alike)
  std::function<void(Eagle3StepCall&)> step;
  std::function<void(int n, const float* aux, float* fused)> fc;  // aux [1, n, W] -> fused_hidden [1, n, H]
};

class FixedEagle3Drafter : public DrafterBackend {
 public:
  // draft: the drafter's own cache layout (the manifest's draft_kv); max_context: the target's; aux_width: n * H;
  // `hook`: the target backend's aux pointer, which this drafter points at its record (and clears when destroyed).
  FixedEagle3Drafter(FixedEagle3Graphs graphs, const KVLayout& draft, int max_context, int aux_width, int hidden,
                     int draft_vocab, float mask_floor, AuxRecord** hook);
  ~FixedEagle3Drafter() override;

  void begin(int64_t position, const Masks&, int64_t) override { rows_.begin(position); }
  DraftStep step(int64_t token, const std::vector<float>& hidden) override;

 private:
  int length_for(int t) const;
  void fuse(int64_t from, int t);                    // x_ [t, H] = fc(aux rows [from, from + t))
  void run(const int64_t* ids, int t, int64_t s);    // t rows after the s written ones, hidden x_ [t, H]

  FixedEagle3Graphs graphs_;
  KVLayout draft_;
  int hidden_, vocab_, slots_;
  float floor_;
  AuxRecord record_;
  Eagle3Rows rows_;
  AuxRecord** hook_;
  std::vector<std::vector<float>> k_, v_, k_new_, v_new_;
  std::vector<float> x_, aux_, fused_, hidden_in_, mask_, logits_, out_hidden_;
  std::vector<int32_t> ids_, positions_, token_ids_;
};

}  // namespace es
