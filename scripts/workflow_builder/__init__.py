"""The bundled workflows' generator, one job a module: node schemas (``schemas``: the pack's read from its
node classes, native ones written there), the model-file table (``models``), a small graph builder
(``graph``), the two ComfyUI formats (``formats``), and the recipes with their notes (``flux2``: klein and
dev; ``fill``: FLUX.1 Fill). ``scripts/build_workflows.py`` writes or checks the files."""
