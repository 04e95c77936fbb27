"""Record a Hugging Face transformers MoE model's routing: ``capture``, ``verify``, ``supported_architectures``.

```python
from turbospark.transformers import capture

with capture(model, "capture.json", trace=True, pilot="next"):
    model.generate(**inputs, max_new_tokens=128)
```

Needs the ``transformers`` extra (torch and transformers); ``import
turbospark`` never imports this package. Every module here imports the real
``transformers`` library by absolute name: this package's own name does not
shadow it.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"turbospark.transformers needs torch and transformers ({exc}); "
        "install them with: pip install 'turbospark[transformers]'"
    ) from exc

from turbospark.transformers._capture import capture, is_capturing
from turbospark.transformers._families import Family, families
from turbospark.transformers._routers import Routing, RouterSite, find_routing
from turbospark.transformers._verify import Verification, verify

__all__ = ["Family", "RouterSite", "Routing", "Verification", "capture", "families", "find_routing", "is_capturing", "verify"]
