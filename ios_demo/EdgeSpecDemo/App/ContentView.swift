// ContentView.swift - the same one screen as the Android demo: bundle picker, prompt, speculation on/off, k,
// streaming output, tok/s, tau and the host check's verdict on this device's kernels.
import SwiftUI

struct ContentView: View {
    @StateObject private var model = DemoModel()

    var body: some View {
        VStack(alignment: .leading, spacing: 8) {
            HStack {
                Picker("Bundle", selection: $model.selected) {
                    ForEach(model.bundles, id: \.self) { Text($0.lastPathComponent).tag(Optional($0)) }
                }
                Button("Rescan") { model.scan() }
                Button("Open") { model.open() }.disabled(model.selected == nil)
            }
            Text(model.info).font(.caption).textSelection(.enabled)
            Text(model.verdict).font(.caption.bold())
                .foregroundColor(model.verdict.contains("exact-") ? .green : .orange)
            TextField("Prompt", text: $model.prompt, axis: .vertical).lineLimit(1...4).textFieldStyle(.roundedBorder)
            HStack {
                Toggle("Speculation", isOn: $model.speculative)
                Toggle("Adaptive", isOn: $model.adaptive).disabled(!model.speculative)
                Toggle("Chat", isOn: $model.chat)
            }
            Stepper("k = \(model.k)", value: $model.k, in: 1...model.maxK).disabled(!model.speculative)
            Stepper("max new tokens: \(model.maxNewTokens)", value: $model.maxNewTokens, in: 8...1024, step: 8)
            HStack {
                Button("Generate") { model.generate() }.disabled(!model.opened || model.running)
                Button("Stop") { model.stop() }.disabled(!model.running)
            }
            Text(model.stats).font(.caption.monospaced())
            ScrollView { Text(model.output).frame(maxWidth: .infinity, alignment: .leading).textSelection(.enabled) }
        }
        .padding()
        .onAppear { model.scan() }
    }
}
