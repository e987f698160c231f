"""A model ready to score with: loaded from the embedded GGUF, a .gguf file, a folder or a hub id
(`loading`, with `weights` and `gguf_pages` keeping the load's memory down), on the backend and
precision chosen for this machine (`precision` decides `--precision auto`; `activation_ranges`
records what int8 smoothing needs)."""
