"""A decoder's language-model head: label-token log-probs at each score row (SGLang's
`/v1/score`), and reranks through the model's recipe on its yes/no tokens."""

import numpy as np

from engine import templates
from engine.kinds import Output
from engine.models import decoder
from engine.tasks.head import Head
from engine.tasks.outputs import softmax_first


class LabelScores(Head):
    kind = "language-model"
    outputs = (Output.LOGPROBS, Output.LOGITS)

    @classmethod
    def fits(cls, config) -> bool:
        return not config.encoder and not config.num_labels and config.embedding is None

    @property
    def name(self) -> str:
        return "language-model"

    def device_output(self, output):
        return decoder.label_logprobs, None

    def row_labels(self, output: Output, labels: list[int]) -> list[int]:
        """A logit reads the negated log-normaliser (the label one past the vocabulary) after
        its label: the label's log-prob less it is the label's logit."""
        return [*labels, self.config.vocab_size] if output is Output.LOGITS else labels

    def row_width(self, output: Output, labels: int) -> int:
        return labels + (output is Output.LOGITS)

    def relevance(self, outputs: np.ndarray, raw: bool) -> np.ndarray:
        """From the yes/no log-probs: P(yes) / (P(yes) + P(no)), or `raw` their difference, the
        logit (a recipe without "no" reads yes and the negated log-normaliser: the same)."""
        x = outputs.astype(np.float64)
        return x[:, 0] - x[:, 1] if raw else softmax_first(x)

    def rerank_labels(self, template, tokenizer) -> templates.RerankLabels | str:
        return templates.rerank_labels(template, tokenizer)
