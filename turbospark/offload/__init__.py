"""Decisions for offloaded inference: the expert cache, GPU-resident expert sets, llama.cpp and KTransformers plans."""
