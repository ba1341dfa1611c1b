"""Steering an edit: how much each reference counts (``reference_strength``), and a prompt per region of the
picture (``regions``). Both reach the DiT as one attention bias built once per call."""
