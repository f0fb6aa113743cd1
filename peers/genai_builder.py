"""onnxruntime-genai's model builder, run with one shim: Gemma-3 configs as transformers 5 reads them.

transformers 5 keeps Gemma-3's two RoPE bases as per-layer-type `rope_parameters` ({"full_attention": {...},
"sliding_attention": {...}}); the 0.18 builder's Gemma-3 path reads the older attributes (`rope_theta`,
`rope_local_base_freq`) and a flat {"rope_type": ...} dict, and fails with KeyError: 'rope_type' (its Gemma-4 path
already reads the nested form). Before the Gemma-3 builder starts, the shim sets those attributes from the nested
dict; nothing else changes. Run as the builder itself:

    python -m edge_spec.peers.genai_builder -i FOLDER -o OUT -p int4 -e cpu -c CACHE
"""

from __future__ import annotations

import sys


def flatten_gemma3_rope(config) -> None:
    """Give a Gemma-3 config with per-layer-type `rope_parameters` the flat attributes the builder reads."""
    rope = getattr(config, "rope_parameters", None)
    if not (isinstance(rope, dict) and "full_attention" in rope and "rope_type" not in rope):
        return
    full = dict(rope["full_attention"])
    local = dict(rope.get("sliding_attention", full))
    if full.get("rope_type", "default") != "default" or local.get("rope_type", "default") != "default":
        raise SystemExit(f"genai_builder: RoPE types {full.get('rope_type')} / {local.get('rope_type')} are not "
                         "flattened by this shim (only 'default')")
    config.rope_theta = full["rope_theta"]
    config.rope_local_base_freq = local["rope_theta"]
    config.rope_parameters = full


def main() -> None:
    import runpy

    import onnxruntime_genai.models  # noqa: F401  (puts the builder's folder on sys.path: it imports `builders`)
    from builders import gemma  # the module objects the builder script itself uses

    init = gemma.Gemma3Model.__init__

    def patched(self, config, *args, **kwargs):
        if type(self) is gemma.Gemma3Model:  # Gemma-4 subclasses it and reads the nested form itself
            flatten_gemma3_rope(config)
        init(self, config, *args, **kwargs)

    gemma.Gemma3Model.__init__ = patched
    sys.argv[0] = "onnxruntime_genai.models.builder"
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
