"""The DeepSpeed and Hugging Face surfaces of the engine: engine methods, per-parameter attributes,
``optimizer.parameter_offload``, fragment access (``safe_get_*``), ``offload_states``."""
