"""Steering an edit: how much each reference counts (``reference_strength``)."""
