package dev.edgespec.runner

// The native methods of app/src/main/cpp/edge_spec_jni.cpp (JNI names Java_dev_edgespec_runner_NativeBridge_*).
// Kotlin only, no android.* import: this file and EdgeSpecRunner.kt build with plain kotlinc and run on a desktop JVM
// (tests/test_android_bridge.py) as well as in the APK. Text crosses as UTF-8 byte arrays (see the .cpp's header).
internal object NativeBridge {
    /** System property naming the bridge library's full path (the host test); otherwise System.loadLibrary. */
    const val LIBRARY_PROPERTY = "edgespec.jni.library"
    const val LIBRARY_NAME = "edge_spec_jni"

    init {
        val explicit = System.getProperty(LIBRARY_PROPERTY)
        if (explicit.isNullOrEmpty()) System.loadLibrary(LIBRARY_NAME) else System.load(java.io.File(explicit).absolutePath)
    }

    @JvmStatic external fun apiVersion(): Int

    /** Returns the es_runner handle; throws EdgeSpecException(code, the runner's message). */
    @JvmStatic external fun open(bundleDir: ByteArray, threads: Int, verifyChecksums: Boolean, hostCheck: Boolean): Long

    @JvmStatic external fun bundleInfo(handle: Long): String

    /**
     * Exactly one of [promptUtf8] / [promptIds] is non-null. [intOptions]: max_new_tokens, chat, top_k, spec, spec_k,
     * adaptive, lookup. Blocks; calls [listener] on this thread once per emitted token. Returns the run's Stats
     * (cancelled = true when es_cancel or the listener stopped it); throws EdgeSpecException on any other failure, or
     * the listener's own exception.
     */
    @JvmStatic external fun generate(
        handle: Long,
        promptUtf8: ByteArray?,
        promptIds: IntArray?,
        intOptions: IntArray,
        temperature: Float,
        topP: Float,
        seed: Long,
        listener: TokenListener,
    ): Stats

    /** Callable from any thread while generate runs on another. */
    @JvmStatic external fun cancel(handle: Long)

    @JvmStatic external fun close(handle: Long)
}
