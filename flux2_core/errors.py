"""The one exception type the core raises for problems a user can fix.

Every message names what is wrong and what to do about it, so the command line and the ComfyUI nodes can show
it as it is, without a traceback.
"""


class Flux2Error(ValueError):
    """A bad file, a wrong model pairing or an impossible setting; the message says how to fix it."""
