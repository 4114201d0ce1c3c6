"""Text to token ids beside the `tokenizers` package: byte-level BPE's shared tables
(`byte_level`, which the GGUF tokenizer loader builds from too) and the native encoder
(`native_tokenizer`)."""
