"""Pictures larger than the model's native size after the fact: an enlarged image refined by klein in
tiles that are blended at every step (``tiled``). (One pass past the native size is the DiT's position
extrapolation, ``dit.extrapolation``.)"""
