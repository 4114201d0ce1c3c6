"""What a request wants back (`Output`) and how its sequences are laid out in a batch (`Layout`):
two values decided once, carried from the public call through the actors to the device program.

A request names its `Output`; the model's task says which outputs it answers and with which
`Layout` (`engine.tasks.Task.layout`); the scheduler batches requests of one output together,
the program builds the forward for it, and the answer's type follows from it.
"""

import enum


class Output(enum.Enum):
    """What each of a request's sequences answers."""

    # f32[L] per item: its label tokens' log-probs under the full-vocabulary softmax at its last
    # token (a language-model head; SGLang's `/v1/score`)
    LOGPROBS = "logprobs"
    # f32[L] per item: logits at its score row: a classification head's of its labels, or a
    # language-model head's label log-probs and then each row's negated log-normaliser (a
    # label's log-prob less it is the label's logit)
    LOGITS = "logits"
    POOLED = "pooled"  # f32[E] per text: its pooled final state (before projection)
    TOKENS = "tokens"  # f32[n, E] per text: every token's final state
    # per text its non-zero vocabulary weights, (i32[k] token ids ascending, f32[k] > 0): a
    # SPLADE head's pooled log-saturated MLM logits, of which only the non-zero leave the device
    SPARSE = "sparse"
    # per text, from one forward: its pooled state f32[E], each token's lexical weight f32[n]
    # and each token's multi-vector f32[n, D] (BGE-M3's three heads: `engine.tasks.m3`)
    HYBRID = "hybrid"
    # per text each token's multi-vector f32[n, D] with its token ids i32[n] (a late-interaction
    # head's, ColBERT's: `engine.tasks.colbert`)
    MULTI = "multi"

    @property
    def title(self) -> str:
        """What it answers, for people."""
        return _TITLES[self]

    @property
    def per_token(self) -> bool:
        """Whether a sequence answers a row per token (else one row, at its score row)."""
        return self in (Output.TOKENS, Output.HYBRID, Output.MULTI)

    @property
    def of_texts(self) -> bool:
        """Whether it embeds texts, each encoded alone and reading no labels (else it reads
        labels of a query/item sequence or pair)."""
        return self in (Output.POOLED, Output.TOKENS, Output.SPARSE, Output.HYBRID, Output.MULTI)

    @property
    def ragged(self) -> bool:
        """Whether each item's answer is an array (or arrays) of its own size, kept per item;
        else its answer is one row of a request's f32[N, W]."""
        return self in (Output.TOKENS, Output.SPARSE, Output.HYBRID, Output.MULTI)


_TITLES = {
    Output.LOGPROBS: "label log-probs",
    Output.LOGITS: "logits",
    Output.POOLED: "pooled vectors",
    Output.TOKENS: "token vectors",
    Output.SPARSE: "sparse vectors",
    Output.HYBRID: "dense, sparse and multi-vectors",
    Output.MULTI: "multi-vectors",
}


class Layout(enum.Enum):
    """How a batch lays out sequences of one output."""

    # items behind their shared prefix, which is computed once; causal; the KV cache keeps
    # prefixes across requests
    SHARED = "shared"
    ALONE = "alone"  # each sequence by itself, causal, nothing read from the KV cache
    # each sequence by itself, every token seeing all of it (an encoder's), scored at its first
    # token; nothing cached
    WHOLE = "whole"

    @property
    def shares(self) -> bool:
        """Whether sequences share their prefixes' computation (and the KV cache)."""
        return self is Layout.SHARED
