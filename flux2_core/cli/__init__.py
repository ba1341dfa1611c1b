"""The command line, ``python -m flux2_core generate ...``: the parser and the run (``main``), its checks
and files (``inputs``), the editing inputs (``edit``), FLUX.1 Fill's run (``fill``) and ``--parallel``
(``parallel``)."""
