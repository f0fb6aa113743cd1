package dev.edgespec.demo

import android.app.Activity
import android.graphics.Color
import android.os.Bundle
import android.widget.ArrayAdapter
import android.widget.Button
import android.widget.EditText
import android.widget.ScrollView
import android.widget.SeekBar
import android.widget.Spinner
import android.widget.Switch
import android.widget.TextView
import dev.edgespec.runner.BundleEntry
import dev.edgespec.runner.Bundles
import dev.edgespec.runner.EdgeSpecException
import dev.edgespec.runner.EdgeSpecRunner
import dev.edgespec.runner.GenerateOptions
import dev.edgespec.runner.OpenOptions
import dev.edgespec.runner.Stats
import org.json.JSONObject
import java.io.File
import java.util.concurrent.ExecutorService
import java.util.concurrent.Executors

// The one screen. UI only: the runner (dev.edgespec.runner, tested on the host JVM) does the work on a single
// background thread; tokens are appended to the output as the listener receives them.
class MainActivity : Activity() {
    private val worker: ExecutorService = Executors.newSingleThreadExecutor { Thread(it, "edge-spec") }
    @Volatile private var runner: EdgeSpecRunner? = null
    private var bundles: List<BundleEntry> = emptyList()

    private lateinit var bundleSpinner: Spinner
    private lateinit var bundleInfo: TextView
    private lateinit var verdict: TextView
    private lateinit var prompt: EditText
    private lateinit var speculation: Switch
    private lateinit var adaptive: Switch
    private lateinit var chat: Switch
    private lateinit var kBar: SeekBar
    private lateinit var kLabel: TextView
    private lateinit var maxNew: EditText
    private lateinit var generate: Button
    private lateinit var stop: Button
    private lateinit var stats: TextView
    private lateinit var output: TextView
    private lateinit var outputScroll: ScrollView

    private fun roots(): List<File?> = listOf(
        getExternalFilesDir("bundles"), // adb push BUNDLE /sdcard/Android/data/dev.edgespec.demo/files/bundles/
        File(filesDir, "bundles"),
        File("/data/local/tmp/edge-spec"), // readable on many (not all) devices
    )

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        setContentView(R.layout.activity_main)
        bundleSpinner = findViewById(R.id.bundles)
        bundleInfo = findViewById(R.id.bundle_info)
        verdict = findViewById(R.id.verdict)
        prompt = findViewById(R.id.prompt)
        speculation = findViewById(R.id.speculation)
        adaptive = findViewById(R.id.adaptive)
        chat = findViewById(R.id.chat)
        kBar = findViewById(R.id.k)
        kLabel = findViewById(R.id.k_label)
        maxNew = findViewById(R.id.max_new)
        generate = findViewById(R.id.generate)
        stop = findViewById(R.id.stop)
        stats = findViewById(R.id.stats)
        output = findViewById(R.id.output)
        outputScroll = findViewById(R.id.output_scroll)

        findViewById<Button>(R.id.rescan).setOnClickListener { scan() }
        findViewById<Button>(R.id.open).setOnClickListener { openSelected() }
        generate.setOnClickListener { startGeneration() }
        stop.setOnClickListener { runner?.cancel() }
        speculation.setOnCheckedChangeListener { _, on -> kBar.isEnabled = on; adaptive.isEnabled = on }
        kBar.setOnSeekBarChangeListener(object : SeekBar.OnSeekBarChangeListener {
            override fun onProgressChanged(bar: SeekBar, progress: Int, fromUser: Boolean) = showK()
            override fun onStartTrackingTouch(bar: SeekBar) {}
            override fun onStopTrackingTouch(bar: SeekBar) {}
        })
        showK()
        generate.isEnabled = false
        scan()
    }

    override fun onDestroy() {
        super.onDestroy()
        val r = runner
        runner = null
        r?.cancel()
        worker.execute { r?.close() }
        worker.shutdown()
    }

    private fun showK() {
        kLabel.text = "k = ${kBar.progress + 1}"
    }

    private fun scan() {
        getExternalFilesDir("bundles")?.mkdirs()
        bundles = Bundles.find(roots())
        bundleSpinner.adapter = ArrayAdapter(this, android.R.layout.simple_spinner_dropdown_item,
                                             bundles.map { it.name })
        if (bundles.isEmpty()) {
            bundleInfo.text = getString(R.string.no_bundles, getExternalFilesDir("bundles")?.absolutePath ?: "")
        }
    }

    private fun openSelected() {
        val entry = bundles.getOrNull(bundleSpinner.selectedItemPosition) ?: return
        generate.isEnabled = false
        bundleInfo.text = "opening ${entry.path} (checksums, host check)…"
        verdict.text = ""
        val previous = runner
        runner = null
        worker.execute {
            previous?.close()
            try {
                val opened = EdgeSpecRunner.open(entry.path, OpenOptions())
                val info = JSONObject(opened.bundleInfoJson)
                runOnUiThread { showOpened(opened, info) }
            } catch (e: EdgeSpecException) {
                runOnUiThread { bundleInfo.text = "cannot open (${e.status}): ${e.message}" }
            } catch (e: UnsatisfiedLinkError) {
                runOnUiThread { bundleInfo.text = "native library: ${e.message}" }
            }
        }
    }

    private fun showOpened(opened: EdgeSpecRunner, info: JSONObject) {
        runner = opened
        val maxDraft = info.optInt("max_draft_len", 1).coerceAtLeast(1)
        kBar.max = maxDraft - 1
        if (kBar.progress > kBar.max) kBar.progress = kBar.max
        speculation.isEnabled = info.optBoolean("drafter", false)
        if (!speculation.isEnabled) speculation.isChecked = false
        bundleInfo.text = "${info.optString("model")} · ${info.optString("format")} ${info.optString("precision")} · " +
            "context ${info.optInt("max_context")} · max k $maxDraft\n${info.optString("runtime")}"
        val check = info.optJSONObject("host_check")
        showVerdict(check?.optString("verdict") ?: "skipped", "", check?.optString("cpu") ?: "")
        generate.isEnabled = true
    }

    private fun showVerdict(label: String, notice: String, cpu: String) {
        val exact = label.startsWith("exact")
        verdict.setTextColor(if (exact) Color.rgb(0, 120, 0) else Color.rgb(170, 90, 0))
        verdict.text = buildString {
            append("host check: ").append(label)
            if (cpu.isNotEmpty()) append(" on ").append(cpu)
            if (notice.isNotEmpty()) append("\n").append(notice)
        }
    }

    private fun startGeneration() {
        val r = runner ?: return
        val options = GenerateOptions(
            maxNewTokens = maxNew.text.toString().toIntOrNull()?.coerceAtLeast(1) ?: 128,
            chat = chat.isChecked,
            speculative = speculation.isChecked,
            specK = kBar.progress + 1,
            adaptive = adaptive.isChecked,
        )
        val text = prompt.text.toString()
        output.text = ""
        output.setTextColor(Color.BLACK)
        stats.text = "prefill…"
        generate.isEnabled = false
        stop.isEnabled = true
        worker.execute {
            try {
                val generation = r.generate(text, options) { _, piece ->
                    if (piece.isNotEmpty()) runOnUiThread {
                        output.append(piece)
                        outputScroll.post { outputScroll.fullScroll(ScrollView.FOCUS_DOWN) }
                    }
                    true
                }
                runOnUiThread { showStats(generation.stats) }
            } catch (e: EdgeSpecException) {
                runOnUiThread {
                    output.setTextColor(Color.rgb(170, 0, 0))
                    output.text = "error (${e.status}): ${e.message}"
                    stats.text = ""
                }
            } finally {
                runOnUiThread {
                    generate.isEnabled = runner != null
                    stop.isEnabled = false
                }
            }
        }
    }

    private fun showStats(s: Stats) {
        stats.text = String.format(
            "%d tok · %.1f tok/s · tau %.2f · %d target passes · prefill %.2f s (%d prompt tok) · spec %s%s",
            s.newTokens, s.tokensPerSecond, s.tau, s.targetPasses, s.prefillSeconds, s.promptTokens,
            if (s.speculationUsed) "on" else "off", if (s.cancelled) " · stopped" else "",
        )
        showVerdict(s.hostCheck, s.notice, "")
    }
}
