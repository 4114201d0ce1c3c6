"""What score rows' outputs become: label probabilities and rerank relevances."""

import numpy as np


def scores_from_logprobs(logprobs: np.ndarray, *, apply_softmax: bool) -> np.ndarray:
    """`exp(logprob)`, or the softmax over the labels (f64 for exactness at tiny probabilities)."""
    lp = logprobs.astype(np.float64)
    if apply_softmax:
        lp = lp - lp.max(axis=1, keepdims=True)
        return np.exp(lp) / np.exp(lp).sum(axis=1, keepdims=True)
    return np.exp(lp)


def softmax_first(x: np.ndarray) -> np.ndarray:
    """The softmax of each row f64[N, L], at its first column."""
    return scores_from_logprobs(x, apply_softmax=True)[:, 0]


def classifier_relevance(logits: np.ndarray, raw: bool) -> np.ndarray:
    """From a classification head's logits f32[N, labels]: one label's sigmoid, or of several
    the softmax of the last; `raw` that label's logit."""
    x = logits.astype(np.float64)
    if raw:
        return x[:, -1]
    if x.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-x[:, 0]))
    return scores_from_logprobs(x, apply_softmax=True)[:, -1]
