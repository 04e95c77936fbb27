"""Recording inside llama.cpp through llama-cpp-python (extra ``llama-cpp``).

``capture(path, trace=True)`` records every llama.cpp context created in its
block; ``python -m turbospark.llama_cpp SCRIPT`` (or ``-m MODULE``) runs an
unchanged program under it, with the capture configured by the
``TURBOSPARK_*`` variables; ``override_tensors`` loads a model with
llama.cpp's tensor buffer-type overrides (``-ot``), which llama-cpp-python's
``Llama`` has no argument for. See docs/llama_cpp.md.

Importing this package does not import llama-cpp-python; the first capture does.
"""

from turbospark.llama_cpp._capture import ContextInfo, LlamaCapture, capture
from turbospark.llama_cpp._ggml import LayoutError
from turbospark.llama_cpp._overrides import override_tensors

__all__ = ["ContextInfo", "LayoutError", "LlamaCapture", "capture", "override_tensors"]
