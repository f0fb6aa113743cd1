// DemoModel.swift - the screen's state; runs the runner on one background queue and publishes tokens as they come.
import Foundation
import SwiftUI

@MainActor
final class DemoModel: ObservableObject {
    @Published var bundles: [URL] = []
    @Published var selected: URL?
    @Published var info = ""
    @Published var verdict = ""
    @Published var prompt = "Explain speculative decoding in two sentences."
    @Published var speculative = true
    @Published var adaptive = true
    @Published var chat = true
    @Published var k = 4
    @Published var maxK = 8
    @Published var maxNewTokens = 128
    @Published var output = ""
    @Published var stats = ""
    @Published var running = false
    @Published var opened = false

    private var runner: EdgeSpecRunner?
    private let queue = DispatchQueue(label: "edge-spec")

    /// Documents/bundles/<name>: copy a bundle there with Finder (file sharing) or
    /// `xcrun devicectl device copy to ... --domain-identifier dev.edgespec.demo --destination Documents/bundles/NAME`.
    var bundlesRoot: URL {
        FileManager.default.urls(for: .documentDirectory, in: .userDomainMask)[0].appendingPathComponent("bundles")
    }

    func scan() {
        try? FileManager.default.createDirectory(at: bundlesRoot, withIntermediateDirectories: true)
        let children = (try? FileManager.default.contentsOfDirectory(at: bundlesRoot, includingPropertiesForKeys: nil)) ?? []
        bundles = children.filter { FileManager.default.fileExists(atPath: $0.appendingPathComponent("manifest.json").path) }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
        if selected == nil { selected = bundles.first }
        if bundles.isEmpty { info = "No bundle in \(bundlesRoot.path)" }
    }

    func open() {
        guard let url = selected else { return }
        let previous = runner
        runner = nil
        opened = false
        info = "opening \(url.lastPathComponent) (checksums, host check)…"
        queue.async {
            previous?.close()
            do {
                let r = try EdgeSpecRunner(bundle: url)
                let json = r.bundleInfoJSON
                Task { @MainActor in self.showOpened(r, json) }
            } catch {
                Task { @MainActor in self.info = "cannot open: \(error)" }
            }
        }
    }

    private func showOpened(_ r: EdgeSpecRunner, _ json: String) {
        runner = r
        opened = true
        let obj = (try? JSONSerialization.jsonObject(with: Data(json.utf8))) as? [String: Any] ?? [:]
        maxK = max(1, obj["max_draft_len"] as? Int ?? 1)
        k = min(k, maxK)
        info = "\(obj["model"] ?? "") · \(obj["format"] ?? "") \(obj["precision"] ?? "") · context \(obj["max_context"] ?? "")"
            + "\n\(obj["runtime"] ?? "")"
        let check = obj["host_check"] as? [String: Any]
        verdict = "host check: \(check?["verdict"] ?? "skipped") \(check?["cpu"].map { "on \($0)" } ?? "")"
    }

    func generate() {
        guard let r = runner, !running else { return }
        var o = GenerateOptions()
        o.maxNewTokens = Int32(maxNewTokens)
        o.chat = chat
        o.speculative = speculative
        o.specK = Int32(k)
        o.adaptive = adaptive
        output = ""
        stats = "prefill…"
        running = true
        let prompt = self.prompt
        queue.async {
            do {
                let s = try r.generate(prompt: prompt, options: o) { _, piece in
                    if !piece.isEmpty { Task { @MainActor in self.output += piece } }
                    return true
                }
                Task { @MainActor in
                    self.stats = String(format: "%d tok · %.1f tok/s · tau %.2f · %d passes · prefill %.2f s · spec %@%@",
                                        s.newTokens, s.tokensPerSecond, s.tau, s.targetPasses, s.prefillSeconds,
                                        s.speculationUsed ? "on" : "off", s.cancelled ? " · stopped" : "")
                    self.verdict = "host check: \(s.hostCheck)" + (s.notice.isEmpty ? "" : "\n\(s.notice)")
                    self.running = false
                }
            } catch {
                Task { @MainActor in
                    self.output = "error: \(error)"
                    self.stats = ""
                    self.running = false
                }
            }
        }
    }

    func stop() { runner?.cancel() }
}
