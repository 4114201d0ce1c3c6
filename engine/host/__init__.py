"""Host preparation of a request before the device sees it: its inputs checked and tokenised
(`inputs`, `pairs`, `truncation`), its sequences planned into batches (`planning`, `chunking`,
the prefix cache's bookkeeping `kv_cache`) and laid out as flat arrays (`packing`, `batching`,
the padding grid `buckets`)."""
