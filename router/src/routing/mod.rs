//! Pure routing core: KV index, TTFT prediction, choice and baseline policies (no I/O).
