// edge-spec Android demo: one app module. The native runner it builds lives outside this folder
// (../runtimes/native); app/src/main/cpp/CMakeLists.txt finds it from here.
pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
}
dependencyResolutionManagement {
    repositoriesMode.set(RepositoriesMode.FAIL_ON_PROJECT_REPOS)
    repositories {
        google()
        mavenCentral()
    }
}
rootProject.name = "edge-spec-demo"
include(":app")
