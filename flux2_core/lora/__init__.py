"""LoRAs of every common trainer layout, applied at compute time: reading a file (``read``), naming its keys
in ours (``keys``), matching it to a model and refusing one made for another (``match``), building the
weight patches (``patches``), the report of what matched (``report``), preparing a LoRA for one model
(``prepare``) and applying it for a run (``apply``)."""
