"""A decoder with its language-model head: label-token log-probs at each score row
(SGLang's `/v1/score`), and reranks through the model's recipe on its yes/no tokens."""

import numpy as np

from engine.kinds import Output
from engine.models import decoder
from engine.models.layout import place_decoder
from engine.tasks.base import Task
from engine.tasks.outputs import softmax_first


class LanguageModel(Task):
    name = "language-model"
    architecture = "decoder"
    head = "language-model"
    outputs = (Output.LOGPROBS, Output.LOGITS)
    forward = staticmethod(decoder.forward)
    output = staticmethod(decoder.label_logprobs)
    place = staticmethod(place_decoder)

    @classmethod
    def fits(cls, config) -> bool:
        return not config.encoder and not config.num_labels

    def relevance(self, outputs: np.ndarray, raw: bool) -> np.ndarray:
        """From the yes/no log-probs: P(yes) / (P(yes) + P(no)), or `raw` their difference, the
        logit (a recipe without "no" reads yes and the negated log-normaliser: the same)."""
        x = outputs.astype(np.float64)
        return x[:, 0] - x[:, 1] if raw else softmax_first(x)
