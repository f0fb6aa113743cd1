// The edge-spec demo app: one Activity (dev.edgespec.demo.MainActivity) over dev.edgespec.runner.EdgeSpecRunner (Kotlin,
// no android.* import) and libedge_spec_jni.so (app/src/main/cpp: the JNI bridge + the native runner + ExecuTorch).
// arm64-v8a only: that is the ABI the runner's host check and ExecuTorch's XNNPACK kernels are meant for on phones.
plugins {
    id("com.android.application")
    id("org.jetbrains.kotlin.android")
}

val abi = "arm64-v8a"
val executorchPrefix: String = (findProperty("edgespec.executorchPrefix") as String?)
    ?: rootProject.file("third-party/executorch-android/$abi").absolutePath
val withQnn = (findProperty("edgespec.qnn") as String?)?.toBoolean() ?: false

android {
    namespace = "dev.edgespec.demo"
    compileSdk = 35
    ndkVersion = "27.2.12479018" // NDK r27c

    defaultConfig {
        applicationId = "dev.edgespec.demo"
        minSdk = 26
        targetSdk = 35
        versionCode = 1
        versionName = "0.1"
        ndk { abiFilters += abi }
        externalNativeBuild {
            cmake {
                arguments += listOf(
                    "-DANDROID_STL=c++_shared",
                    "-DANDROID_PLATFORM=android-26",
                    "-DEXECUTORCH_ANDROID_PREFIX=$executorchPrefix",
                    "-DES_WITH_QNN=${if (withQnn) "ON" else "OFF"}",
                )
                cppFlags += listOf("-std=c++17", "-fexceptions", "-frtti")
                targets += "edge_spec_jni"
            }
        }
    }

    externalNativeBuild {
        cmake {
            path = file("src/main/cpp/CMakeLists.txt")
            version = "3.31.6" // >= 3.24 (WHOLE_ARCHIVE); install with the SDK manager: cmake;3.31.6
        }
    }

    buildTypes {
        release {
            isMinifyEnabled = false
            signingConfig = signingConfigs.getByName("debug") // a demo: sideloaded, debug-signed
        }
    }
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    kotlinOptions { jvmTarget = "17" }
    packaging {
        jniLibs.useLegacyPackaging = true // extract .so files: ExecuTorch's mmap loader and QNN's skel libs want paths
    }
}

// ExecuTorch for Android, from source (git clone at build time on the developer's machine; nothing is fetched on the
// phone). Skipped when the install prefix already exists.
val buildExecuTorch by tasks.registering(Exec::class) {
    group = "edge-spec"
    description = "Clone + build ExecuTorch (XNNPACK${if (withQnn) ", QNN" else ""}) for $abi into $executorchPrefix"
    onlyIf { !file("$executorchPrefix/lib/cmake/ExecuTorch").exists() && !file("$executorchPrefix/lib/cmake/executorch").exists() }
    workingDir = rootProject.projectDir
    commandLine("bash", "scripts/build_executorch_android.sh")
    environment("ANDROID_ABI", abi)
    environment("EXECUTORCH_ANDROID_PREFIX", executorchPrefix)
    doFirst { environment("ANDROID_NDK", android.ndkDirectory.absolutePath) }
}
tasks.configureEach {
    if (name.startsWith("configureCMake") || name.startsWith("buildCMake")) dependsOn(buildExecuTorch)
}

dependencies {
    // none: the platform's widgets only (no AndroidX), the runner is native, the Kotlin stdlib comes with the plugin
}
