"""The diffusion transformer: double and single blocks (``layers``), 4-axis RoPE and position ids (``rope``),
the reference key/value cache of the 9B-KV model (``kv_cache``), the model and its loaded handle
(``transformer``), and how a DiT file becomes one (``files``)."""
