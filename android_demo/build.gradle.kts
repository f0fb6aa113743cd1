// Versions verified together: AGP 8.7.3 needs Gradle >= 8.9 (wrapper: 8.10.2) and JDK 17; Kotlin 2.1.0.
plugins {
    id("com.android.application") version "8.7.3" apply false
    id("org.jetbrains.kotlin.android") version "2.1.0" apply false
}
