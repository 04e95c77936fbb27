"""The pure-Python recorder core's parts, one module for each ``.pxi`` file of the compiled core.

``recording/_recorder_py.py`` composes them into ``RecorderCore``; each
module here is the twin of the ``csrc/`` file of the same name:

==========================  =============================================================
``_core.py``                ``_core.pxi``: state, construction, the facade's helpers, take
``_record_one.py``          ``_record_one.pxi``: ``record``, ``record_prediction``
``_record_block.py``        ``_record_block.pxi``: ``record_many``, ``record_prediction_many``
``_record_tagged.py``       ``_record_tagged.pxi``: ``record_batch``
``_tags.py``                ``_tags.pxi``: the tag columns' defaults and padding
``_json.py``                ``_json.pxi``: the core's part of the JSON document
``_buffers.py``             ``_buffers.pxi``: the append-only id buffers and their copies out
==========================  =============================================================

``_views.pxi`` and ``_kernels.pxi`` (reading the caller's ids) have their twin
in ``recording/_convert.py``, which the compiled core also uses for its slow paths.
"""
