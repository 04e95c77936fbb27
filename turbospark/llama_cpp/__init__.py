"""Recording inside llama.cpp through llama-cpp-python (extra ``llama-cpp``)."""
