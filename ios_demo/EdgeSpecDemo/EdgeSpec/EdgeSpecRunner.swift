// EdgeSpecRunner.swift - a thin Swift wrapper over the native runner's C API (edge_spec.h via the CEdgeSpec module).
// Marshalling only, like the Android bridge: the loop, the tokenizer and the host check are the runner's. Errors are
// thrown with the runner's own message; es_cancel is the one call allowed from another thread.
import CEdgeSpec
import Foundation

public struct EdgeSpecError: Error, CustomStringConvertible {
    public let code: UInt32 // es_status
    public let message: String
    public var description: String { message }
}

public struct GenerateOptions {
    public var maxNewTokens: Int32 = 128
    public var chat = false
    public var temperature: Float = 0
    public var topK: Int32 = 0
    public var topP: Float = 1
    public var seed: UInt64 = 0
    public var speculative = true
    public var specK: Int32 = 4
    public var adaptive = true
    public var lookup = true
    public init() {}

    var c: es_generate_options {
        var o = es_generate_options()
        es_default_generate_options(&o)
        o.max_new_tokens = maxNewTokens
        o.chat = chat ? 1 : 0
        o.temperature = temperature
        o.top_k = topK
        o.top_p = topP
        o.seed = seed
        o.spec = speculative ? 1 : 0
        o.spec_k = specK
        o.adaptive = adaptive ? 1 : 0
        o.lookup = lookup ? 1 : 0
        return o
    }
}

public struct Stats {
    public let promptTokens: Int32
    public let newTokens: Int32
    public let targetPasses: Int32
    public let tau: Double
    public let prefillSeconds: Double
    public let decodeSeconds: Double
    public let tokensPerSecond: Double
    public let speculationUsed: Bool
    public let hostCheck: String // exact-one-row, exact-two-row, inexact, skipped
    public let notice: String
    public let cancelled: Bool
}

/// A fixed-size C char array (imported as a tuple) -> String.
private func text<T>(_ tuple: T) -> String {
    withUnsafeBytes(of: tuple) { raw in String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self) }
}

private final class CallbackBox {
    let onToken: (Int32, String) -> Bool
    init(_ onToken: @escaping (Int32, String) -> Bool) { self.onToken = onToken }
}

public final class EdgeSpecRunner: @unchecked Sendable {
    private var handle: OpaquePointer?
    private let lock = NSLock() // cancel() vs close()

    public static var apiVersion: Int32 { es_api_version() }

    /// Opens a bundle folder (manifest.json + artifacts from `edge-spec export`) and runs the host check.
    public init(bundle: URL, threads: Int32 = 0, verifyChecksums: Bool = true, hostCheck: Bool = true) throws {
        var o = es_open_options()
        _ = es_open_options_init(&o) // struct_size = the header's size (API version 2), the defaults
        o.threads = threads
        o.verify_checksums = verifyChecksums ? 1 : 0
        o.host_check = hostCheck ? 1 : 0
        var h: OpaquePointer?
        let status = es_open(bundle.path, &o, &h)
        guard status == ES_OK, let h else {
            throw EdgeSpecError(code: status.rawValue, message: String(cString: es_open_error()))
        }
        handle = h
    }

    deinit { close() }

    /// es_bundle_info_json: format, precision, model, max_context, max_draft_len, drafter, runtime, host_check.
    public var bundleInfoJSON: String {
        lock.lock(); defer { lock.unlock() }
        return handle.map { String(cString: es_bundle_info_json($0)) } ?? "{}"
    }

    /// Blocks (call it off the main thread); onToken runs on this thread per token, return false to stop.
    public func generate(prompt: String, options: GenerateOptions = GenerateOptions(),
                         onToken: @escaping (Int32, String) -> Bool) throws -> Stats {
        guard let handle else { throw EdgeSpecError(code: ES_ERR_ARGUMENT.rawValue, message: "the runner is closed") }
        let box = CallbackBox(onToken)
        var o = options.c
        var s = es_stats()
        let status: es_status = withExtendedLifetime(box) {
            es_generate(handle, prompt, &o, { user, id, piece in
                let box = Unmanaged<CallbackBox>.fromOpaque(user!).takeUnretainedValue()
                return box.onToken(id, piece.map { String(cString: $0) } ?? "") ? 0 : 1
            }, Unmanaged.passUnretained(box).toOpaque(), &s)
        }
        if status != ES_OK && status != ES_ERR_CANCELLED {
            throw EdgeSpecError(code: status.rawValue, message: String(cString: es_last_error(handle)))
        }
        return Stats(promptTokens: s.prompt_tokens, newTokens: s.new_tokens, targetPasses: s.target_passes, tau: s.tau,
                     prefillSeconds: s.prefill_s, decodeSeconds: s.decode_s, tokensPerSecond: s.tok_per_s,
                     speculationUsed: s.spec_used != 0, hostCheck: text(s.host_check), notice: text(s.notice),
                     cancelled: status == ES_ERR_CANCELLED)
    }

    /// Any thread: stops the run in progress after its current step.
    public func cancel() {
        lock.lock(); defer { lock.unlock() }
        if let handle { es_cancel(handle) }
    }

    /// Frees the runner (call after generate returned; deinit does it too).
    public func close() {
        lock.lock(); defer { lock.unlock() }
        if let handle { es_close(handle) }
        handle = nil
    }
}
