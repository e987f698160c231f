"""What the two web apps (`serve`, the labelling page in `label`) share below their frameworks:

    guard   the token check: where a token is read from, the constant-time compare, JSON refusals
    bind    the listening socket, bound before the model loads so that a taken port fails at once

Layer: with `backends` and `io` (imports only the bottom layer; never serve, label or above). No
web framework is imported here: both apps are plain ASGI callables at this level.
"""
