package dev.edgespec.runner

import java.io.File

/** A bundle folder found on the device: a directory holding manifest.json (what `edge-spec export --out` writes). */
data class BundleEntry(val name: String, val path: String)

/** Lists the bundles directly under each root (and a root that is itself a bundle). No android.* import. */
object Bundles {
    const val MANIFEST = "manifest.json"

    fun find(roots: List<File?>): List<BundleEntry> {
        val out = ArrayList<BundleEntry>()
        for (root in roots.filterNotNull()) {
            if (!root.isDirectory) continue
            if (File(root, MANIFEST).isFile) out.add(BundleEntry(root.name, root.absolutePath))
            root.listFiles()?.filter { it.isDirectory && File(it, MANIFEST).isFile }?.sortedBy { it.name }?.forEach {
                out.add(BundleEntry("${it.name}  (${root.absolutePath})", it.absolutePath))
            }
        }
        return out.distinctBy { it.path }
    }
}
