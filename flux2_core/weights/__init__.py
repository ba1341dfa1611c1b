"""Where the weights come from: lazy checkpoint reading (``checkpoint``: safetensors files and folders,
``gguf_file`` and ``gguf_quants``: GGUF), Hugging Face Hub ids (``hub``), foreign key names (``keymaps``),
quantised formats kept quantised (``quant``), and the one loading pipeline every component goes through
(``loading``: strip -> map -> config from shapes -> meta build -> strict fill in one dtype policy)."""
