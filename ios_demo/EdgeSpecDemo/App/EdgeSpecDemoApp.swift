import SwiftUI

@main
struct EdgeSpecDemoApp: App {
    var body: some Scene {
        WindowGroup { ContentView() }
    }
}
