"""specpilot-bench: the profiling Job that measures speculative-decoding methods against a real vLLM engine."""
