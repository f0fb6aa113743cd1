/* edge_spec.h - the native runner's C API: what the Android JNI bridge and the iOS Swift wrapper call.
 *
 * One bundle (manifest.json + artifacts, as written by `edge-spec export`) is opened into a handle; generate()
 * runs the bundle's draft-verify loop (or plain decoding) and streams each emitted token's text through a
 * callback. No C++ exception crosses this boundary: every call returns an es_status, and the handle keeps the
 * last error's message (with the fix, as the Python runtime words it) for es_last_error().
 *
 * Threading: one handle is used by one thread at a time; es_cancel() is the exception, callable from any
 * thread while es_generate() runs on another (it sets a flag the loop reads between steps).
 */
#ifndef EDGE_SPEC_H
#define EDGE_SPEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2: es_open_options starts with struct_size (es_open_options_init sets it; es_open refuses a size it does not know
   with ES_ERR_VERSION), so fields can be appended without breaking apps compiled against an older header. */
#define ES_API_VERSION 2

typedef enum es_status {
  ES_OK = 0,
  ES_ERR_ARGUMENT = 1,   /* a bad parameter (temperature < 0, top_p outside (0, 1], k < 1, NULL handle, ...) */
  ES_ERR_BUNDLE = 2,     /* manifest missing / unreadable / wrong schema, checksum mismatch, drafter/target mismatch */
  ES_ERR_BACKEND = 3,    /* the format's runtime failed to load or run a graph */
  ES_ERR_CONTEXT = 4,    /* the prompt plus max_new_tokens does not fit the bundle's context */
  ES_ERR_ENCODING = 5,   /* the prompt is not valid UTF-8 */
  ES_ERR_CANCELLED = 6,  /* es_cancel() stopped the run; the tokens emitted so far were delivered */
  ES_ERR_INTERNAL = 7,
  ES_ERR_VERSION = 8     /* es_open_options.struct_size is not a size this library knows (an app compiled against
                            another edge_spec.h, or options not started with es_open_options_init) */
} es_status;

typedef struct es_runner es_runner; /* opaque */

typedef struct es_open_options {
  size_t struct_size;       /* first, always: sizeof(es_open_options) as the caller compiled it. es_open_options_init
                               sets it (with the defaults below); es_open refuses any size it does not know with
                               ES_ERR_VERSION. New fields are appended after the last one, never inserted. */
  int32_t threads;          /* 0: the backend's default; more than the device's cores: capped at the core count
                               (std::thread::hardware_concurrency); < 0: ES_ERR_ARGUMENT */
  int32_t verify_checksums; /* 1 (default): sha256 of every file the runner loads, as the Python runtime does */
  int32_t host_check;       /* 1 (default): run the exactness check on this device's kernels at open; spec off
                               (with a notice in es_stats.notice) where verify rows != decode steps */
  const char* compute_units; /* coreml bundles (macOS 15 / iOS 18 builds): "all" | "cpu_and_ne" | "cpu_and_gpu" |
                               "cpu"; NULL or "" (default): all. Refused for other formats */
} es_open_options;

typedef struct es_generate_options {
  int32_t max_new_tokens; /* > 0 */
  int32_t chat;           /* 1: wrap the prompt in the bundle's chat template (user turn + generation prompt) */
  float temperature;      /* 0: greedy */
  int32_t top_k;          /* 0: off */
  float top_p;            /* 1: off */
  uint64_t seed;          /* the portable RNG's seed (same tokens as the Python runtime for the same seed) */
  int32_t spec;           /* 0: plain decoding */
  int32_t spec_k;         /* draft length (fixed) or its cap (adaptive); <= the bundle's max draft length */
  int32_t adaptive;       /* 1: the cost model picks k per step */
  int32_t lookup;         /* 1: prompt-lookup (retrieval) drafting beside the MTP drafter */
} es_generate_options;

typedef struct es_stats {
  int32_t prompt_tokens;
  int32_t new_tokens;
  int32_t target_passes;  /* verify passes + plain steps */
  double tau;             /* emitted tokens per target pass (1.0 when plain) */
  double prefill_s;
  double decode_s;
  double tok_per_s;       /* new_tokens / decode_s */
  int32_t spec_used;      /* 0 where the host check turned speculation off, or spec == 0 */
  char host_check[32];    /* "exact-one-row", "exact-two-row", "inexact", "skipped" */
  char notice[256];       /* the check's notice where it changed anything, else "" */
} es_stats;

/* Called once per emitted token, in order: its id and the text it completes (UTF-8; may be "" while a
   multi-byte character is incomplete). Return nonzero to stop (same as es_cancel). After the last token, one more
   call with token_id -1 carries text the stream held back, only when there is some (a run that ended inside a
   multi-byte character: its replacement text); a token_id of -1 is never a token. */
typedef int (*es_token_callback)(void* user, int32_t token_id, const char* text_utf8);

/* The defaults into an es_open_options of `struct_size` bytes (sizeof(es_open_options) where the caller was
   compiled), struct_size set to it; a size this library does not know: ES_ERR_VERSION and nothing written. Call it
   through es_open_options_init, which passes the caller's sizeof. */
es_status es_open_options_defaults(es_open_options* out, size_t struct_size);
/* Starts an es_open_options: every field's default and struct_size = this header's sizeof(es_open_options). */
static inline es_status es_open_options_init(es_open_options* out) {
  return es_open_options_defaults(out, sizeof(*out));
}
/* API version 1's name for es_open_options_init (the same call; the status is ES_OK for this header's struct). */
static inline void es_default_open_options(es_open_options* out) { (void)es_open_options_defaults(out, sizeof(*out)); }
void es_default_generate_options(es_generate_options* out);

/* Opens the bundle folder. `options`: started with es_open_options_init (NULL: the defaults). On failure *out is
   NULL and the message is in es_open_error() (thread-local). */
es_status es_open(const char* bundle_dir, const es_open_options* options, es_runner** out);
const char* es_open_error(void);

es_status es_generate(es_runner* runner, const char* prompt_utf8, const es_generate_options* options,
                      es_token_callback on_token, void* user, es_stats* stats_out);
/* es_generate with the prompt as token ids (an app with its own tokenizer, or a bundle whose tokenizer the runner
   does not read: the callback's text is then ""). Added in API version 1 beside es_generate. */
es_status es_generate_ids(es_runner* runner, const int32_t* prompt_ids, size_t n_prompt,
                          const es_generate_options* options, es_token_callback on_token, void* user,
                          es_stats* stats_out);
/* Stops the run in progress at its next step; called while no run is in progress, it stops the next run before its
   first token (the flag clears when a run ends). */
void es_cancel(es_runner* runner);

/* The last error on this handle ("" if none); valid until the next call on the handle. */
const char* es_last_error(const es_runner* runner);
/* Bundle facts for the UI: format ("executorch", "onnx", ...), precision, model name, max context, max draft len. */
const char* es_bundle_info_json(const es_runner* runner);
void es_close(es_runner* runner);
int32_t es_api_version(void);

#ifdef __cplusplus
}
#endif
#endif /* EDGE_SPEC_H */
