"""The bundled workflows' generator, one job a module: node schemas (``schemas``: the pack's read from its
node classes, native ones written there), the model-file table (``models``), a small graph builder
(``graph``), the two ComfyUI formats (``formats``), what every workflow shares (``layout``), the FLUX.2
graph (``flux2``), its recipes (``flux2_recipes``) and notes (``notes``), and FLUX.1 Fill's (``fill``).
``scripts/build_workflows.py`` writes or checks the files."""
