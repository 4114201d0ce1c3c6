"""The transformers (PyTorch) reference: the same token sequences, the same label log-probs, on
the CPU or a CUDA device (`--baseline-device`); log-probs come back as host numpy arrays."""

import os
from pathlib import Path

import numpy as np

TORCH_DTYPES = ("bfloat16", "float32")


def load_transformers(path: Path, dtype: str, device: str = "cpu"):
    """A transformers causal LM from a `.gguf` file or a Hugging Face directory, in eval mode on
    torch device `device`; the functions here feed it tensors on that device (`model.device`)."""
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count())
    kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent if path.suffix == ".gguf" else path, dtype=getattr(torch, dtype), **kwargs
    )
    return model.to(device).eval()


def hf_label_logprobs(model, seqs, labels, batch_size: int = 1) -> np.ndarray:
    """Log-probs f64[N, L] of `labels` after each sequence, in left-padded batches.

    Padded rows get explicit positions counted from their first real token, so every sequence
    sees the positions it would alone; `logits_to_keep=1` computes the LM head on the last row.
    """
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, len(seqs), batch_size):
            chunk = seqs[i : i + batch_size]
            width = max(map(len, chunk))
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for r, s in enumerate(chunk):
                ids[r, width - len(s) :] = torch.tensor(s)
                mask[r, width - len(s) :] = 1
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            ids, mask, pos = (t.to(model.device) for t in (ids, mask, pos))
            logits = model(
                input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1
            ).logits[:, -1]
            out.append(torch.log_softmax(logits.double(), -1)[:, labels].cpu().numpy())
    return np.concatenate(out)
