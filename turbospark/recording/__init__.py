"""The writer: the recorder facade, its two cores, and (``durable/``) everything that gets a capture to disk.

This ``__init__`` imports nothing; the analysis side (capture, metrics, the decisions,
the outputs) imports nothing of this package at all: what the writer and the readers
share, the capture format, lives in ``turbospark.capture``.
``from turbospark import RouterHistogram`` is the public way in.
"""
