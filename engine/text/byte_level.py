"""Byte-level BPE's constants: GPT-2's byte alphabet and the pre-tokenizer regexes of the
families that split before mapping bytes (Llama 3, Qwen2), as `tokenizers` spells them."""

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table: visible Latin-1 bytes stand for themselves,
    the other 68 bytes are shifted to code points 256 and up in byte order."""
    visible = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {byte: chr(byte) for byte in visible}
    shifted = (byte for byte in range(256) if byte not in table)
    for offset, byte in enumerate(shifted):
        table[byte] = chr(256 + offset)
    return dict(sorted(table.items()))


BYTE_ALPHABET = _byte_alphabet()  # byte -> its character in vocabularies
