// edge_spec_jni.cpp - the JNI bridge between dev.edgespec.runner.NativeBridge (Kotlin, no android.* import) and the
// native runner's C API (runtimes/native/include/edge_spec.h). Marshalling only: no generation logic lives here.
//
// Built twice from this one file:
//   - in the APK (app/src/main/cpp/CMakeLists.txt, NDK, arm64-v8a), linked with the runner and ExecuTorch;
//   - on a desktop JDK for the host test (tests/test_android_bridge.py via android_demo/host/build_host.sh),
//     against $JAVA_HOME/include/jni.h and the x86-64 libedge_spec.so.
//
// Text crosses this boundary as UTF-8 *bytes*, never through NewStringUTF / GetStringUTFChars: those use JNI's
// "modified UTF-8" (NUL as C0 80, characters outside the BMP as two 3-byte surrogates), which the runner rejects as
// invalid UTF-8 and which CheckJNI on Android aborts on for emoji. Strings handed to Java are built with
// new String(byte[], "UTF-8").
//
// Errors: every failing es_status becomes a thrown dev.edgespec.runner.EdgeSpecException(code, message) carrying the
// runner's own message (es_open_error() / es_last_error()). ES_ERR_CANCELLED is not an error here: the Stats object
// comes back with cancelled = true. An exception thrown by the Kotlin token listener stops the run (the callback
// returns nonzero) and is left pending, so it reaches the Kotlin caller unchanged.
#include <jni.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "edge_spec.h"

namespace {

constexpr const char* kExceptionClass = "dev/edgespec/runner/EdgeSpecException";
constexpr const char* kStatsClass = "dev/edgespec/runner/Stats";
// Stats(promptTokens, newTokens, targetPasses, tau, prefillSeconds, decodeSeconds, tokensPerSecond, speculationUsed,
//       hostCheck, notice, cancelled) - the Kotlin primary constructor's JVM signature.
constexpr const char* kStatsCtor = "(IIIDDDDZLjava/lang/String;Ljava/lang/String;Z)V";

JavaVM* g_vm = nullptr;

es_runner* as_runner(jlong handle) { return reinterpret_cast<es_runner*>(static_cast<intptr_t>(handle)); }

// A java.lang.String from UTF-8 bytes (a local reference; nullptr with an exception pending on failure).
jstring utf8_string(JNIEnv* env, const char* text) {
  const jsize n = static_cast<jsize>(text ? std::strlen(text) : 0);
  jbyteArray bytes = env->NewByteArray(n);
  if (!bytes) return nullptr;
  if (n) env->SetByteArrayRegion(bytes, 0, n, reinterpret_cast<const jbyte*>(text));
  jclass string_class = env->FindClass("java/lang/String");
  jmethodID ctor = env->GetMethodID(string_class, "<init>", "([BLjava/lang/String;)V");
  jstring charset = env->NewStringUTF("UTF-8");  // ASCII: modified UTF-8 is fine here
  jstring out = static_cast<jstring>(env->NewObject(string_class, ctor, bytes, charset));
  env->DeleteLocalRef(charset);
  env->DeleteLocalRef(string_class);
  env->DeleteLocalRef(bytes);
  return out;
}

// The bytes of a Kotlin ByteArray as a NUL-terminated std::string (the Kotlin side refuses embedded NULs).
bool bytes_of(JNIEnv* env, jbyteArray array, std::string* out) {
  if (!array) return false;
  const jsize n = env->GetArrayLength(array);
  out->assign(static_cast<size_t>(n), '\0');
  if (n) env->GetByteArrayRegion(array, 0, n, reinterpret_cast<jbyte*>(&(*out)[0]));
  return !env->ExceptionCheck();
}

void throw_edge_spec(JNIEnv* env, int code, const char* message) {
  if (env->ExceptionCheck()) return;  // a pending exception (e.g. from the listener) wins
  jclass cls = env->FindClass(kExceptionClass);
  if (!cls) return;  // NoClassDefFoundError pending
  jmethodID ctor = env->GetMethodID(cls, "<init>", "(ILjava/lang/String;)V");
  jstring text = utf8_string(env, message && *message ? message : "edge-spec: unknown error");
  if (ctor && text) {
    jobject error = env->NewObject(cls, ctor, static_cast<jint>(code), text);
    if (error) env->Throw(static_cast<jthrowable>(error));
  }
  env->DeleteLocalRef(cls);
}

void throw_state(JNIEnv* env, const char* message) {
  jclass cls = env->FindClass("java/lang/IllegalStateException");
  if (cls) env->ThrowNew(cls, message);
}

// One es_generate call's bridge to the Kotlin TokenListener: onToken(id: Int, text: String): Boolean (true = go on).
struct CallbackContext {
  JNIEnv* env;
  std::thread::id thread;
  jobject listener;
  jmethodID on_token;
  bool java_exception = false;
};

int on_token(void* user, int32_t token_id, const char* text_utf8) {
  CallbackContext* ctx = static_cast<CallbackContext*>(user);
  if (ctx->java_exception) return 1;
  JNIEnv* env = ctx->env;
  bool attached = false;
  if (std::this_thread::get_id() != ctx->thread) {  // the runner calls back on the generating thread; just in case
    if (g_vm->GetEnv(reinterpret_cast<void**>(&env), JNI_VERSION_1_6) != JNI_OK) {
      if (g_vm->AttachCurrentThread(reinterpret_cast<void**>(&env), nullptr) != JNI_OK) return 1;
      attached = true;
    }
  }
  int stop = 0;
  jstring text = utf8_string(env, text_utf8);
  if (text) {
    const jboolean go_on = env->CallBooleanMethod(ctx->listener, ctx->on_token, static_cast<jint>(token_id), text);
    env->DeleteLocalRef(text);  // one local reference per token would overflow the local table in a long run
    stop = go_on ? 0 : 1;
  }
  if (env->ExceptionCheck()) {
    ctx->java_exception = true;
    stop = 1;
  }
  if (attached) {
    if (env->ExceptionCheck()) env->ExceptionClear();  // cannot reach the caller from a foreign thread
    g_vm->DetachCurrentThread();
  }
  return stop;
}

jobject make_stats(JNIEnv* env, const es_stats& s, bool cancelled) {
  jclass cls = env->FindClass(kStatsClass);
  if (!cls) return nullptr;
  jmethodID ctor = env->GetMethodID(cls, "<init>", kStatsCtor);
  if (!ctor) return nullptr;
  jstring check = utf8_string(env, s.host_check);
  jstring notice = utf8_string(env, s.notice);
  if (!check || !notice) return nullptr;
  jobject out = env->NewObject(cls, ctor, static_cast<jint>(s.prompt_tokens), static_cast<jint>(s.new_tokens),
                               static_cast<jint>(s.target_passes), static_cast<jdouble>(s.tau),
                               static_cast<jdouble>(s.prefill_s), static_cast<jdouble>(s.decode_s),
                               static_cast<jdouble>(s.tok_per_s), static_cast<jboolean>(s.spec_used != 0), check,
                               notice, static_cast<jboolean>(cancelled));
  env->DeleteLocalRef(check);
  env->DeleteLocalRef(notice);
  env->DeleteLocalRef(cls);
  return out;
}

}  // namespace

extern "C" {

JNIEXPORT jint JNICALL JNI_OnLoad(JavaVM* vm, void*) {
  g_vm = vm;
  return JNI_VERSION_1_6;
}

JNIEXPORT jint JNICALL Java_dev_edgespec_runner_NativeBridge_apiVersion(JNIEnv*, jclass) { return es_api_version(); }

JNIEXPORT jlong JNICALL Java_dev_edgespec_runner_NativeBridge_open(JNIEnv* env, jclass, jbyteArray bundle_dir,
                                                                   jint threads, jboolean verify_checksums,
                                                                   jboolean host_check) {
  std::string dir;
  if (!bytes_of(env, bundle_dir, &dir)) {
    throw_edge_spec(env, ES_ERR_ARGUMENT, "open: the bundle folder is null");
    return 0;
  }
  es_open_options options;
  es_open_options_init(&options);  // struct_size = this header's sizeof (API version 2), the defaults
  options.threads = threads;
  options.verify_checksums = verify_checksums ? 1 : 0;
  options.host_check = host_check ? 1 : 0;
  es_runner* runner = nullptr;
  const es_status status = es_open(dir.c_str(), &options, &runner);
  if (status != ES_OK || !runner) {
    throw_edge_spec(env, status != ES_OK ? status : ES_ERR_INTERNAL, es_open_error());
    return 0;
  }
  return static_cast<jlong>(reinterpret_cast<intptr_t>(runner));
}

JNIEXPORT jstring JNICALL Java_dev_edgespec_runner_NativeBridge_bundleInfo(JNIEnv* env, jclass, jlong handle) {
  if (!handle) {
    throw_state(env, "the runner is closed");
    return nullptr;
  }
  return utf8_string(env, es_bundle_info_json(as_runner(handle)));
}

// options: [max_new_tokens, chat, top_k, spec, spec_k, adaptive, lookup]
JNIEXPORT jobject JNICALL Java_dev_edgespec_runner_NativeBridge_generate(JNIEnv* env, jclass, jlong handle,
                                                                         jbyteArray prompt_utf8, jintArray prompt_ids,
                                                                         jintArray int_options, jfloat temperature,
                                                                         jfloat top_p, jlong seed, jobject listener) {
  es_runner* runner = as_runner(handle);
  if (!runner) {
    throw_state(env, "the runner is closed");
    return nullptr;
  }
  if (!listener || !int_options || env->GetArrayLength(int_options) != 7) {
    throw_edge_spec(env, ES_ERR_ARGUMENT, "generate: a listener and 7 integer options are required");
    return nullptr;
  }
  jint ints[7];
  env->GetIntArrayRegion(int_options, 0, 7, ints);
  es_generate_options options;
  es_default_generate_options(&options);
  options.max_new_tokens = ints[0];
  options.chat = ints[1];
  options.top_k = ints[2];
  options.spec = ints[3];
  options.spec_k = ints[4];
  options.adaptive = ints[5];
  options.lookup = ints[6];
  options.temperature = temperature;
  options.top_p = top_p;
  options.seed = static_cast<uint64_t>(seed);

  jclass listener_class = env->GetObjectClass(listener);
  jmethodID on_token_method = env->GetMethodID(listener_class, "onToken", "(ILjava/lang/String;)Z");
  env->DeleteLocalRef(listener_class);
  if (!on_token_method) return nullptr;  // NoSuchMethodError pending
  // a global reference: valid on any thread (a local one is only valid on this one)
  struct GlobalRef {
    JNIEnv* env;
    jobject ref;
    ~GlobalRef() { env->DeleteGlobalRef(ref); }
  } global{env, env->NewGlobalRef(listener)};
  CallbackContext ctx{env, std::this_thread::get_id(), global.ref, on_token_method};

  es_stats stats;
  std::memset(&stats, 0, sizeof stats);
  es_status status;
  if (prompt_utf8) {
    std::string prompt;
    if (!bytes_of(env, prompt_utf8, &prompt)) return nullptr;
    status = es_generate(runner, prompt.c_str(), &options, on_token, &ctx, &stats);
  } else if (prompt_ids) {
    const jsize n = env->GetArrayLength(prompt_ids);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    if (n) env->GetIntArrayRegion(prompt_ids, 0, n, reinterpret_cast<jint*>(ids.data()));
    status = es_generate_ids(runner, ids.data(), ids.size(), &options, on_token, &ctx, &stats);
  } else {
    throw_edge_spec(env, ES_ERR_ARGUMENT, "generate: pass a prompt or prompt token ids");
    return nullptr;
  }
  if (ctx.java_exception || env->ExceptionCheck()) return nullptr;  // the listener's exception goes to the caller
  if (status != ES_OK && status != ES_ERR_CANCELLED) {
    throw_edge_spec(env, status, es_last_error(runner));
    return nullptr;
  }
  return make_stats(env, stats, status == ES_ERR_CANCELLED);
}

JNIEXPORT void JNICALL Java_dev_edgespec_runner_NativeBridge_cancel(JNIEnv*, jclass, jlong handle) {
  if (handle) es_cancel(as_runner(handle));
}

JNIEXPORT void JNICALL Java_dev_edgespec_runner_NativeBridge_close(JNIEnv*, jclass, jlong handle) {
  if (handle) es_close(as_runner(handle));
}

}  // extern "C"
