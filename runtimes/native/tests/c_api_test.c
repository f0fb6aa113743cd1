/* c_api_test.c - the C API as an app uses it: open a bundle, generate with a per-token callback (plain and
 * speculative), stop from the callback, read stats and errors. Plain C99 against edge_spec.h only.
 *
 *   c_api_test BUNDLE_DIR IDS [MAX_NEW_TOKENS [FORMAT]]   (IDS: comma-separated prompt token ids; FORMAT: the
 *                                                         bundle's, default executorch)
 *
 * Prints one JSON line {"plain": [...], "spec": [...], "spec_tau": ..., "cancelled_after": N, "checks": N} and exits
 * 0 when every check passed; each failed check prints "FAIL: ..." to stderr and the exit status is 1.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edge_spec.h"

static int failures = 0, checks = 0;

static void check(int ok, const char* what, const char* detail) {
  checks++;
  if (!ok) {
    failures++;
    fprintf(stderr, "FAIL: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  }
}

typedef struct {
  int32_t ids[4096];
  int n;
  int stop_after; /* > 0: return nonzero from the callback after this many tokens */
} collected;

static int on_token(void* user, int32_t token_id, const char* text) {
  collected* c = (collected*)user;
  (void)text;
  if (token_id < 0) return 0; /* the end-of-run flush of held-back text: not a token */
  if (c->n < 4096) c->ids[c->n++] = token_id;
  return c->stop_after > 0 && c->n >= c->stop_after;
}

/* es_cancel from another thread: the generating thread's callback waits for the cancel after its second token */
typedef struct {
  es_runner* runner;
  const int32_t* prompt;
  size_t n_prompt;
  es_generate_options options;
  es_status status;
  int tokens;
  volatile int reached; /* set by the callback once two tokens are out */
  volatile int cancelled;
} threaded;

static int slow_token(void* user, int32_t token_id, const char* text) {
  threaded* t = (threaded*)user;
  struct timespec pause = {0, 2000000};
  (void)token_id;
  (void)text;
  if (++t->tokens == 2) {
    t->reached = 1;
    while (!t->cancelled) nanosleep(&pause, NULL); /* the next step must see the flag */
  }
  return 0;
}

static void* generate_thread(void* arg) {
  threaded* t = (threaded*)arg;
  t->status = es_generate_ids(t->runner, t->prompt, t->n_prompt, &t->options, slow_token, t, NULL);
  return NULL;
}

static void print_ids(const char* key, const collected* c) {
  int i;
  printf("\"%s\":[", key);
  for (i = 0; i < c->n; ++i) printf("%s%d", i ? "," : "", (int)c->ids[i]);
  printf("]");
}

int main(int argc, char** argv) {
  es_open_options open_options;
  es_generate_options options;
  es_stats stats;
  es_runner* runner = NULL;
  es_status status;
  int32_t prompt[1024];
  size_t n_prompt = 0;
  char* cursor;
  collected plain, spec, cut;
  int max_new = argc > 3 ? atoi(argv[3]) : 24;
  char format_field[64];

  if (argc < 3) {
    fprintf(stderr, "usage: c_api_test BUNDLE_DIR IDS [MAX_NEW_TOKENS [FORMAT]]\n");
    return 2;
  }
  snprintf(format_field, sizeof format_field, "\"format\":\"%s\"", argc > 4 ? argv[4] : "executorch");
  for (cursor = argv[2]; *cursor && n_prompt < 1024;) {
    prompt[n_prompt++] = (int32_t)strtol(cursor, &cursor, 10);
    if (*cursor == ',') cursor++;
  }

  check(es_api_version() == ES_API_VERSION, "es_api_version", NULL);

  /* a missing bundle: NULL handle, an error naming the folder */
  status = es_open("/nonexistent/bundle", NULL, &runner);
  check(status == ES_ERR_BUNDLE && runner == NULL, "es_open of a missing folder returns ES_ERR_BUNDLE", es_open_error());
  check(strstr(es_open_error(), "/nonexistent/bundle") != NULL, "the open error names the folder", es_open_error());

  /* the options struct's size (API version 2): es_open_options_init sets it; a size the library does not know is
     refused before anything is opened, naming the field and the fix; a size es_open_options_defaults does not know
     writes nothing */
  check(es_open_options_init(&open_options) == ES_OK && open_options.struct_size == sizeof(es_open_options) &&
            open_options.verify_checksums == 1 && open_options.host_check == 1 && open_options.threads == 0,
        "es_open_options_init sets struct_size and the defaults", NULL);
  {
    es_open_options odd = open_options;
    odd.struct_size = sizeof(es_open_options) - 8; /* an app compiled against another header */
    status = es_open(argv[1], &odd, &runner);
    check(status == ES_ERR_VERSION && runner == NULL, "es_open refuses an unknown struct_size with ES_ERR_VERSION",
          es_open_error());
    check(strstr(es_open_error(), "struct_size") != NULL && strstr(es_open_error(), "fix:") != NULL,
          "the version error names struct_size and the fix", es_open_error());
    odd.threads = 7;
    check(es_open_options_defaults(&odd, sizeof(es_open_options) + 8) == ES_ERR_VERSION && odd.threads == 7,
          "es_open_options_defaults refuses an unknown size and writes nothing", NULL);
  }

  es_open_options_init(&open_options);
  open_options.threads = 2;
  status = es_open(argv[1], &open_options, &runner);
  if (status != ES_OK) {
    fprintf(stderr, "FAIL: es_open(%s): %s\n", argv[1], es_open_error());
    return 1;
  }
  check(strstr(es_bundle_info_json(runner), format_field) != NULL, "bundle info names the format",
        es_bundle_info_json(runner));

  es_default_generate_options(&options);
  options.max_new_tokens = max_new;
  options.lookup = 0;
  options.adaptive = 0;

  /* bad arguments: a code and a message, nothing run */
  options.temperature = -1.0f;
  status = es_generate_ids(runner, prompt, n_prompt, &options, NULL, NULL, &stats);
  check(status == ES_ERR_ARGUMENT && strstr(es_last_error(runner), "temperature") != NULL,
        "temperature < 0 is ES_ERR_ARGUMENT", es_last_error(runner));
  options.temperature = 0.0f;
  check(es_generate_ids(NULL, prompt, n_prompt, &options, NULL, NULL, NULL) == ES_ERR_ARGUMENT, "NULL handle", NULL);
  options.max_new_tokens = 100000;
  status = es_generate_ids(runner, prompt, n_prompt, &options, NULL, NULL, &stats);
  check(status == ES_ERR_CONTEXT, "prompt + max_new_tokens beyond the context is ES_ERR_CONTEXT", es_last_error(runner));
  options.max_new_tokens = max_new;
  check(es_generate(runner, "\xff\xfe bad", &options, NULL, NULL, &stats) == ES_ERR_ENCODING,
        "invalid UTF-8 is ES_ERR_ENCODING", es_last_error(runner));

  /* plain and speculative greedy: the same tokens */
  memset(&plain, 0, sizeof plain);
  options.spec = 0;
  status = es_generate_ids(runner, prompt, n_prompt, &options, on_token, &plain, &stats);
  check(status == ES_OK && stats.spec_used == 0 && stats.new_tokens == plain.n, "plain generation",
        es_last_error(runner));
  memset(&spec, 0, sizeof spec);
  options.spec = 1;
  options.spec_k = 2;
  status = es_generate_ids(runner, prompt, n_prompt, &options, on_token, &spec, &stats);
  check(status == ES_OK && stats.new_tokens == spec.n, "speculative generation", es_last_error(runner));
  check(stats.spec_used == 1 || stats.notice[0] != '\0', "speculation used, or a notice says why not", stats.notice);
  check(plain.n == spec.n && memcmp(plain.ids, spec.ids, sizeof(int32_t) * (size_t)plain.n) == 0,
        "speculative greedy tokens == plain greedy tokens", NULL);

  /* the callback stops the run: ES_ERR_CANCELLED, the tokens so far delivered */
  memset(&cut, 0, sizeof cut);
  cut.stop_after = 3;
  status = es_generate_ids(runner, prompt, n_prompt, &options, on_token, &cut, &stats);
  check(status == ES_ERR_CANCELLED && cut.n == 3, "a nonzero callback return cancels", es_last_error(runner));

  {
    threaded t;
    pthread_t thread;
    struct timespec pause = {0, 1000000};
    memset(&t, 0, sizeof t);
    t.runner = runner;
    t.prompt = prompt;
    t.n_prompt = n_prompt;
    t.options = options;
    pthread_create(&thread, NULL, generate_thread, &t);
    while (!t.reached) nanosleep(&pause, NULL);
    es_cancel(runner);
    t.cancelled = 1;
    pthread_join(thread, NULL);
    check(t.status == ES_ERR_CANCELLED && t.tokens < max_new, "es_cancel from another thread stops the run",
          es_last_error(runner));
  }

  {
    /* a cancel that lands before a run starts stops that run before its first token; the run after it is whole */
    collected early;
    memset(&early, 0, sizeof early);
    es_cancel(runner);
    status = es_generate_ids(runner, prompt, n_prompt, &options, on_token, &early, &stats);
    check(status == ES_ERR_CANCELLED && early.n == 0, "an es_cancel before the run stops it", es_last_error(runner));
    memset(&early, 0, sizeof early);
    status = es_generate_ids(runner, prompt, n_prompt, &options, on_token, &early, &stats);
    check(status == ES_OK && early.n == spec.n, "the run after an early cancel is whole", es_last_error(runner));
  }

  {
    /* threads: more than the cores is capped (the backend's identity never shows 100000), < 0 refused; last, as
       executorch's thread pool is the process's */
    es_runner* other = NULL;
    es_open_options many = open_options;
    many.threads = 100000;
    many.host_check = 0;
    many.verify_checksums = 0;
    status = es_open(argv[1], &many, &other);
    check(status == ES_OK && other != NULL, "threads beyond the core count open (capped)", es_open_error());
    if (other) check(strstr(es_bundle_info_json(other), "100000") == NULL, "the thread count is capped",
                     es_bundle_info_json(other));
    es_close(other);
    many.threads = -1;
    status = es_open(argv[1], &many, &other);
    check(status == ES_ERR_ARGUMENT && other == NULL && strstr(es_open_error(), "threads") != NULL,
          "threads < 0 is ES_ERR_ARGUMENT", es_open_error());
  }

  printf("{");
  print_ids("plain", &plain);
  printf(",");
  print_ids("spec", &spec);
  printf(",\"spec_tau\":%.4f,\"host_check\":\"%s\",\"cancelled_after\":%d,\"checks\":%d,\"failures\":%d}\n", stats.tau,
         stats.host_check, cut.n, checks, failures);
  es_close(runner);
  return failures ? 1 : 0;
}
