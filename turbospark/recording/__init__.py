"""The recording wing: the recorder facade, its two cores and everything that gets a capture to disk.

This ``__init__`` imports nothing, so the analysis wing can use the output
helpers (``_f32display``, ``_atomic``) without loading a recorder core;
``from turbospark import RouterHistogram`` is the public way in.
"""
