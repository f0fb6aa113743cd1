package dev.edgespec.host

import dev.edgespec.runner.EdgeSpecException
import dev.edgespec.runner.EdgeSpecRunner
import dev.edgespec.runner.GenerateOptions
import dev.edgespec.runner.OpenOptions
import dev.edgespec.runner.Status
import java.util.concurrent.CountDownLatch
import java.util.concurrent.TimeUnit
import kotlin.concurrent.thread
import kotlin.system.exitProcess

// The host-JVM check of the Android bridge: the same Kotlin class (dev.edgespec.runner.EdgeSpecRunner) and JNI
// library (edge_spec_jni.cpp) the APK uses, loaded by a desktop JDK with the x86-64 runner. Driven by
// tests/test_android_bridge.py, which compares the token ids printed here with the Python runtime's.
//
//   java -Dedgespec.jni.library=build/android-host/cmake/libedge_spec_jni.so -cp build/android-host/bridge-check.jar \
//        dev.edgespec.host.BridgeCheckKt --bundle DIR --ids 5,6,7 --max-new 24 [--spec-k 2] [--damaged DIR]
//        [--prompt TEXT --chat]
//
// Prints one JSON line; exits 0 when every self-check passed (each failure is listed in "failures" and on stderr).

private val failures = ArrayList<String>()
private var checks = 0

private fun check(ok: Boolean, what: String) {
    checks++
    if (!ok) {
        failures.add(what)
        System.err.println("FAIL: $what")
    }
}

private fun quote(s: String): String {
    val out = StringBuilder("\"")
    for (c in s) {
        when {
            c == '"' -> out.append("\\\"")
            c == '\\' -> out.append("\\\\")
            c == '\n' -> out.append("\\n")
            c < ' ' -> out.append(String.format("\\u%04x", c.code))
            else -> out.append(c)
        }
    }
    return out.append('"').toString()
}

private fun ints(a: IntArray) = a.joinToString(",", "[", "]")

private fun errorJson(e: EdgeSpecException?) =
    if (e == null) "null" else "{\"code\":${e.code},\"status\":${quote(e.status)},\"message\":${quote(e.message ?: "")}}"

private inline fun expectFailure(block: () -> Unit): EdgeSpecException? =
    try {
        block()
        null
    } catch (e: EdgeSpecException) {
        e
    }

fun main(args: Array<String>) {
    val opts = HashMap<String, String>()
    var i = 0
    while (i < args.size) {
        val key = args[i].removePrefix("--")
        if (key == "chat") opts[key] = "1" else opts[key] = args[++i]
        i++
    }
    val bundle = opts["bundle"] ?: error("--bundle DIR is required")
    val ids = opts["ids"]?.split(",")?.map { it.trim().toInt() }?.toIntArray() ?: error("--ids is required")
    val maxNew = opts["max-new"]?.toInt() ?: 24
    val specK = opts["spec-k"]?.toInt() ?: 2
    val fields = LinkedHashMap<String, String>()
    val t0 = System.nanoTime()

    check(EdgeSpecRunner.apiVersion == 2, "apiVersion == 2")
    fields["api_version"] = EdgeSpecRunner.apiVersion.toString()

    // errors from open: a missing folder, a damaged bundle - the runner's message, as an exception
    val missing = expectFailure { EdgeSpecRunner.open("/nonexistent/edge-spec-bundle") }
    check(missing != null && missing.code == Status.BUNDLE, "open of a missing folder throws (BUNDLE)")
    fields["missing_error"] = errorJson(missing)
    opts["damaged"]?.let { damaged ->
        val e = expectFailure { EdgeSpecRunner.open(damaged, OpenOptions(threads = 2)) }
        check(e != null, "open of a damaged bundle throws")
        fields["damaged_error"] = errorJson(e)
    }

    val runner = EdgeSpecRunner.open(bundle, OpenOptions(threads = 2))
    fields["open_s"] = String.format("%.3f", (System.nanoTime() - t0) / 1e9)
    fields["info"] = quote(runner.bundleInfoJson)

    // greedy plain, through the callback API
    val seen = ArrayList<Int>()
    val plain = runner.generate(ids, GenerateOptions(maxNewTokens = maxNew, speculative = false)) { id, _ ->
        seen.add(id)
        true
    }
    check(seen.toIntArray().contentEquals(plain.tokens), "listener saw every token, in order")
    check(!plain.stats.cancelled && !plain.stats.speculationUsed, "plain run: not cancelled, no speculation")
    check(plain.stats.newTokens == plain.tokens.size, "stats.newTokens == tokens delivered")
    fields["plain"] = ints(plain.tokens)

    // greedy speculative, fixed k, through the blocking iterator
    val spec = runner.stream(ids, GenerateOptions(maxNewTokens = maxNew, specK = specK, adaptive = false))
    val streamed = ArrayList<Int>()
    for (token in spec) streamed.add(token.id)
    val specResult = spec.result()
    check(streamed.toIntArray().contentEquals(specResult.tokens), "the iterator yields the generation's tokens")
    check(specResult.tokens.contentEquals(plain.tokens), "speculative greedy == plain greedy")
    fields["spec"] = ints(specResult.tokens)
    fields["spec_used"] = specResult.stats.speculationUsed.toString()
    fields["tau"] = specResult.stats.tau.toString()
    fields["target_passes"] = specResult.stats.targetPasses.toString()
    fields["host_check"] = quote(specResult.stats.hostCheck)
    fields["notice"] = quote(specResult.stats.notice)
    fields["tok_per_s"] = String.format("%.1f", specResult.stats.tokensPerSecond)

    // adaptive (the app's default), callback API again
    val adaptive = runner.generate(ids, GenerateOptions(maxNewTokens = maxNew, specK = 4))
    check(adaptive.tokens.contentEquals(plain.tokens), "adaptive speculative greedy == plain greedy")

    // cancel 1: a listener returning false stops the run; the token it was handed counts as delivered
    val stopped = runner.generate(ids, GenerateOptions(maxNewTokens = maxNew, speculative = false)) { _, _ -> false }
    check(stopped.stats.cancelled && stopped.tokens.size == 1, "a listener returning false at once: 1 token")
    var count = 0
    val three = runner.generate(ids, GenerateOptions(maxNewTokens = maxNew, specK = specK, adaptive = false)) { _, _ ->
        ++count < 3
    }
    check(three.stats.cancelled && three.tokens.size == 3 && three.tokens.contentEquals(plain.tokens.copyOf(3)),
          "stop from the listener at the 3rd token (speculative): 3 tokens, the plain prefix")
    fields["listener_stop_tokens"] = three.tokens.size.toString()

    // cancel 2: EdgeSpecRunner.cancel() from another thread while generate() blocks in this one
    val started = CountDownLatch(2)
    val long = GenerateOptions(maxNewTokens = opts["long"]?.toInt() ?: 100, speculative = false)
    val canceller = thread(name = "canceller") {
        started.await(30, TimeUnit.SECONDS)
        runner.cancel()
    }
    val cancelled = runner.generate(ids, long) { _, _ ->
        started.countDown()
        Thread.sleep(20) // a slow consumer, so the cancel lands mid-run
        true
    }
    canceller.join()
    check(cancelled.stats.cancelled && cancelled.tokens.size in 2 until long.maxNewTokens,
          "cancel() from another thread stops generate() mid-run")
    check(cancelled.tokens.contentEquals(plain.tokens.copyOf(minOf(cancelled.tokens.size, plain.tokens.size)))
          || cancelled.tokens.size > plain.tokens.size, "the cancelled run's tokens are the greedy prefix")
    fields["thread_cancel_tokens"] = cancelled.tokens.size.toString()

    // cancel 3: TokenStream.cancel() after 3 tokens read (a one-token buffer, so the run waits for this reader)
    val stream = runner.stream(ids, long, bufferTokens = 1)
    var read = 0
    while (stream.hasNext()) {
        stream.next()
        if (++read == 3) stream.cancel()
    }
    val streamResult = stream.result()
    // at most what was queued (the buffer's token + its end slot) and the one put in flight when cancel() landed
    check(streamResult.stats.cancelled && read in 3..6, "TokenStream.cancel() ends the iterator (read $read)")
    fields["stream_cancel_read"] = read.toString()

    // the runner stays usable after cancels: same greedy tokens again
    val again = runner.generate(ids, GenerateOptions(maxNewTokens = maxNew, speculative = false))
    check(again.tokens.contentEquals(plain.tokens), "after cancels, the same greedy tokens")

    // errors from generate, with the runner's message
    val badK = expectFailure { runner.generate(ids, GenerateOptions(maxNewTokens = 4, specK = 999)) }
    check(badK != null && badK.code == Status.ARGUMENT, "spec_k beyond the bundle's max draft length -> ARGUMENT")
    fields["spec_k_error"] = errorJson(badK)
    val overflow = expectFailure { runner.generate(ids, GenerateOptions(maxNewTokens = 1_000_000)) }
    check(overflow != null && overflow.code == Status.CONTEXT, "max_new_tokens past the context -> CONTEXT")
    fields["context_error"] = errorJson(overflow)
    val badTemp = expectFailure { runner.generate(ids, GenerateOptions(maxNewTokens = 4, temperature = -1f)) }
    check(badTemp != null && badTemp.code == Status.ARGUMENT, "temperature < 0 -> ARGUMENT")
    fields["temperature_error"] = errorJson(badTemp)
    val vocab = expectFailure { runner.generate(intArrayOf(5, 100000), GenerateOptions(maxNewTokens = 4)) }
    check(vocab != null, "a token id outside the vocabulary throws")
    fields["vocab_error"] = errorJson(vocab)
    // a listener's own exception reaches the caller unchanged, and the runner stays usable
    val boom = try {
        runner.generate(ids, GenerateOptions(maxNewTokens = 8)) { _, _ -> throw IllegalStateException("boom") }
        null
    } catch (e: IllegalStateException) {
        e.message
    }
    check(boom == "boom", "the listener's exception propagates")
    // re-entering the runner from its own listener is refused (the C API handle is not reentrant)
    val reentry = try {
        runner.generate(ids, GenerateOptions(maxNewTokens = 4)) { _, _ -> runner.close(); true }
        null
    } catch (e: IllegalStateException) {
        e.message
    }
    check(reentry != null && reentry.startsWith("close() called from inside a token listener") && !runner.isClosed,
          "close() from the listener is refused and the runner stays open")
    // a failure inside a stream surfaces from the iterator
    val streamFailure = try {
        val s = runner.stream(ids, GenerateOptions(maxNewTokens = 4, specK = 999))
        while (s.hasNext()) s.next()
        null
    } catch (e: EdgeSpecException) {
        e
    }
    check(streamFailure != null && streamFailure.code == Status.ARGUMENT, "a stream's failure is thrown by hasNext()")
    check(runner.generate(ids, GenerateOptions(maxNewTokens = maxNew, speculative = false)).tokens
              .contentEquals(plain.tokens), "after errors, the same greedy tokens")

    // text prompts (the bundle's tokenizer through the runner); a bundle whose tokenizer the runner cannot read
    // must fail with an exception, never crash
    opts["prompt"]?.let { prompt ->
        val chat = opts.containsKey("chat")
        try {
            val text = runner.generate(prompt, GenerateOptions(maxNewTokens = maxNew, chat = chat, specK = 4))
            fields["text_tokens"] = ints(text.tokens)
            fields["text"] = quote(text.text)
            fields["text_prompt_tokens"] = text.stats.promptTokens.toString()
            fields["text_tau"] = text.stats.tau.toString()
            fields["text_spec_used"] = text.stats.speculationUsed.toString()
            fields["text_tok_per_s"] = String.format("%.1f", text.stats.tokensPerSecond)
            val plainText = runner.generate(prompt, GenerateOptions(maxNewTokens = maxNew, chat = chat, speculative = false))
            check(plainText.tokens.contentEquals(text.tokens), "text prompt: speculative == plain")
            fields["text_plain_tokens"] = ints(plainText.tokens)
        } catch (e: EdgeSpecException) {
            fields["text_error"] = errorJson(e)
        }
    }

    runner.close()
    runner.close() // idempotent
    val closed = try {
        runner.generate(ids, GenerateOptions(maxNewTokens = 2))
        null
    } catch (e: IllegalStateException) {
        e.message
    }
    check(closed == "the runner is closed", "use after close -> IllegalStateException")

    fields["checks"] = checks.toString()
    fields["failures"] = failures.joinToString(",", "[", "]") { quote(it) }
    fields["total_s"] = String.format("%.3f", (System.nanoTime() - t0) / 1e9)
    println(fields.entries.joinToString(",", "{", "}") { "${quote(it.key)}:${it.value}" })
    exitProcess(if (failures.isEmpty()) 0 else 1)
}
