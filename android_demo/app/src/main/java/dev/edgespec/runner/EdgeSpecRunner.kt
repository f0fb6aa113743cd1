package dev.edgespec.runner

import java.util.concurrent.LinkedBlockingQueue

// The app-facing Kotlin API over the native runner (runtimes/native/include/edge_spec.h through edge_spec_jni.cpp).
// No android.* import and no kotlinx library: it compiles with plain kotlinc and runs on a desktop JVM, which is how
// it is tested (tests/test_android_bridge.py). Marshalling and threading only; the loop, the tokenizer and the host
// check are the runner's.

/** The runner's es_status codes (edge_spec.h). */
object Status {
    const val OK = 0
    const val ARGUMENT = 1
    const val BUNDLE = 2
    const val BACKEND = 3
    const val CONTEXT = 4
    const val ENCODING = 5
    const val CANCELLED = 6
    const val INTERNAL = 7
    const val VERSION = 8

    fun name(code: Int): String = when (code) {
        OK -> "ok"
        ARGUMENT -> "argument"
        BUNDLE -> "bundle"
        BACKEND -> "backend"
        CONTEXT -> "context"
        ENCODING -> "encoding"
        CANCELLED -> "cancelled"
        INTERNAL -> "internal"
        VERSION -> "version"
        else -> "status $code"
    }
}

/** A failing es_status with the runner's own message (the file named, the fix), as es_last_error() words it. */
class EdgeSpecException(val code: Int, message: String) : RuntimeException(message) {
    val status: String get() = Status.name(code)
}

/** es_open_options. */
data class OpenOptions(
    val threads: Int = 0,
    val verifyChecksums: Boolean = true,
    val hostCheck: Boolean = true,
)

/** es_generate_options (same defaults as es_default_generate_options). */
data class GenerateOptions(
    val maxNewTokens: Int = 128,
    val chat: Boolean = false,
    val temperature: Float = 0f,
    val topK: Int = 0,
    val topP: Float = 1f,
    val seed: Long = 0L,
    val speculative: Boolean = true,
    val specK: Int = 4,
    val adaptive: Boolean = true,
    val lookup: Boolean = true,
) {
    internal fun ints() = intArrayOf(
        maxNewTokens, if (chat) 1 else 0, topK, if (speculative) 1 else 0, specK, if (adaptive) 1 else 0,
        if (lookup) 1 else 0,
    )
}

/** es_stats, plus whether the run was cancelled (es_cancel, cancel(), or a listener returning false). */
data class Stats(
    val promptTokens: Int,
    val newTokens: Int,
    val targetPasses: Int,
    val tau: Double,
    val prefillSeconds: Double,
    val decodeSeconds: Double,
    val tokensPerSecond: Double,
    val speculationUsed: Boolean,
    /** The host check's verdict on this device's kernels: exact-one-row, exact-two-row, inexact, skipped. */
    val hostCheck: String,
    /** The check's notice where it changed anything (speculation turned off), else "". */
    val notice: String,
    val cancelled: Boolean,
)

/** One emitted token: its id and the text it completes ("" while a multi-byte character is incomplete). */
data class Token(val id: Int, val text: String)

/** What a finished (or cancelled) run produced. */
class Generation(val tokens: IntArray, val text: String, val stats: Stats)

/** Called on the generating thread once per token, in order. Return false to stop the run (a cancel). */
fun interface TokenListener {
    fun onToken(id: Int, text: String): Boolean
}

/**
 * One opened bundle. generate() blocks the calling thread (run it off the UI thread) and calls the listener per
 * token; stream() runs it on a worker thread and hands tokens out through a blocking iterator. One generation at a
 * time per runner; cancel() and close() may be called from any thread.
 */
class EdgeSpecRunner private constructor(handle: Long) : AutoCloseable {
    @Volatile private var handle: Long = handle
    @Volatile private var cancelRequested = false
    private val generationLock = Object() // one es_generate at a time on this handle
    private val handleLock = Object() // cancel() vs close()

    companion object {
        /** ES_API_VERSION of the loaded native library. */
        @JvmStatic
        val apiVersion: Int get() = NativeBridge.apiVersion()

        /** Opens a bundle folder (manifest.json + artifacts, from `edge-spec export`); runs the host check there. */
        @JvmStatic
        @JvmOverloads
        fun open(bundleDir: String, options: OpenOptions = OpenOptions()): EdgeSpecRunner {
            if (bundleDir.indexOf('\u0000') >= 0) throw EdgeSpecException(Status.ARGUMENT, "the bundle path contains NUL")
            val handle = NativeBridge.open(
                bundleDir.toByteArray(Charsets.UTF_8), options.threads, options.verifyChecksums, options.hostCheck,
            )
            return EdgeSpecRunner(handle)
        }
    }

    /** es_bundle_info_json: format, precision, model, max_context, max_draft_len, drafter, runtime, host_check. */
    val bundleInfoJson: String get() = NativeBridge.bundleInfo(live())

    /** Generates from a text prompt (the bundle's tokenizer; chat = its chat template). Blocks. */
    fun generate(prompt: String, options: GenerateOptions = GenerateOptions(), listener: TokenListener? = null): Generation {
        if (prompt.indexOf('\u0000') >= 0) throw EdgeSpecException(Status.ARGUMENT, "the prompt contains NUL")
        return run(prompt.toByteArray(Charsets.UTF_8), null, options, listener, null)
    }

    /** Generates from prompt token ids (no tokenizer needed; the token texts are then ""). Blocks. */
    fun generate(promptIds: IntArray, options: GenerateOptions = GenerateOptions(), listener: TokenListener? = null): Generation =
        run(null, promptIds.copyOf(), options, listener, null)

    /**
     * Starts generating on a worker thread; iterate the returned stream for tokens as they come. [bufferTokens] > 0
     * bounds the tokens waiting to be read (the run then waits for a slow reader); 0: unbounded, so a reader never
     * slows the loop down (its tok/s stays the runner's own).
     */
    @JvmOverloads
    fun stream(prompt: String, options: GenerateOptions = GenerateOptions(), bufferTokens: Int = 0): TokenStream {
        if (prompt.indexOf('\u0000') >= 0) throw EdgeSpecException(Status.ARGUMENT, "the prompt contains NUL")
        return TokenStream(this, prompt.toByteArray(Charsets.UTF_8), null, options, bufferTokens)
    }

    @JvmOverloads
    fun stream(promptIds: IntArray, options: GenerateOptions = GenerateOptions(), bufferTokens: Int = 0): TokenStream =
        TokenStream(this, null, promptIds.copyOf(), options, bufferTokens)

    /** Stops the run in progress after its current step (tokens so far stay delivered). Any thread. */
    fun cancel() {
        cancelRequested = true
        synchronized(handleLock) { if (handle != 0L) NativeBridge.cancel(handle) }
    }

    /** Cancels a run in progress, waits for it to return, then frees the native runner. Idempotent. */
    override fun close() {
        if (handle == 0L) return
        check(!Thread.holdsLock(generationLock)) {
            "close() called from inside a token listener: return false from the listener to stop, then close()"
        }
        cancel()
        synchronized(generationLock) {
            synchronized(handleLock) {
                val h = handle
                handle = 0L
                if (h != 0L) NativeBridge.close(h)
            }
        }
    }

    val isClosed: Boolean get() = handle == 0L

    private fun live(): Long = handle.also { if (it == 0L) throw IllegalStateException("the runner is closed") }

    internal fun run(
        prompt: ByteArray?,
        ids: IntArray?,
        options: GenerateOptions,
        listener: TokenListener?,
        stop: (() -> Boolean)?,
    ): Generation {
        check(!Thread.holdsLock(generationLock)) { "generate() called from inside a token listener of this runner" }
        return synchronized(generationLock) { runLocked(prompt, ids, options, listener, stop) }
    }

    private fun runLocked(
        prompt: ByteArray?,
        ids: IntArray?,
        options: GenerateOptions,
        listener: TokenListener?,
        stop: (() -> Boolean)?,
    ): Generation {
        val h = live()
        cancelRequested = false
        val tokens = ArrayList<Int>()
        val text = StringBuilder()
        val sink = TokenListener { id, piece ->
            if (cancelRequested || (stop != null && stop())) return@TokenListener false
            if (id >= 0) tokens.add(id)  // -1: no token, the text the runner held back at the end (edge_spec.h)
            text.append(piece)
            listener?.onToken(id, piece) ?: true
        }
        val stats = NativeBridge.generate(h, prompt, ids, options.ints(), options.temperature, options.topP,
                                          options.seed, sink)
        return Generation(tokens.toIntArray(), text.toString(), stats)
    }
}

/**
 * Tokens of one generation running on a worker thread, as a blocking iterator: hasNext() waits for the next token
 * or the end; a failure of the run (EdgeSpecException with the runner's message) is thrown from hasNext()/next().
 * cancel() stops the run (the iterator then ends and result().stats.cancelled is true); close() cancels and waits.
 */
class TokenStream internal constructor(
    private val runner: EdgeSpecRunner,
    prompt: ByteArray?,
    ids: IntArray?,
    options: GenerateOptions,
    bufferTokens: Int,
) : Iterator<Token>, AutoCloseable {
    private class Done(val generation: Generation)
    private class Failed(val error: Throwable)

    private val events = LinkedBlockingQueue<Any>(if (bufferTokens > 0) bufferTokens + 1 else Int.MAX_VALUE)
    @Volatile private var cancelled = false
    private var pending: Any? = null
    private var end: Any? = null // Done or Failed, once taken from the queue
    private val worker = Thread({
        try {
            // after cancel() no token is queued and the run stops at the next one (a verify pass may emit several)
            val generation = runner.run(prompt, ids, options, { id, text ->
                if (!cancelled) events.put(Token(id, text))
                !cancelled
            }, { cancelled })
            events.put(Done(generation))
        } catch (error: Throwable) {
            events.put(Failed(error))
        }
    }, "edge-spec-generate")

    init {
        worker.isDaemon = true
        worker.start()
    }

    override fun hasNext(): Boolean {
        if (pending == null && end == null) {
            val event = events.take()
            if (event is Token) pending = event else end = event
        }
        (end as? Failed)?.let { throw it.error }
        return pending != null
    }

    override fun next(): Token {
        if (!hasNext()) throw NoSuchElementException("the generation has ended")
        val token = pending as Token
        pending = null
        return token
    }

    /** Waits for the end of the run (draining tokens not yet iterated) and returns it; throws the run's failure. */
    fun result(): Generation {
        while (hasNext()) next()
        return (end as Done).generation
    }

    /** Stops the run after its current step; any thread. */
    fun cancel() {
        cancelled = true
        runner.cancel()
    }

    /** Cancels and waits for the worker to finish (dropping unread tokens). */
    override fun close() {
        cancel()
        while (worker.isAlive) {
            events.clear() // a bounded buffer's writer may be waiting for room
            worker.join(10)
        }
    }
}
