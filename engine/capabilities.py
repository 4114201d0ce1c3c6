"""What a loaded model can do, as data: one record computed once at load from its task (and its
rerank recipe), asked by every caller that offers or refuses something: the `Engine` methods,
the HTTP endpoint table, `/v1/models`, `/get_model_info`, the REPL and `Engine.info()`. A refusal
reads the same words wherever it is met."""

import enum

import msgspec

from engine.errors import InvalidInput, Unsupported


class Ability(enum.Enum):
    """What a caller may ask of a model: the verbs first, then what a configuration asks."""

    SCORE = "score"  # label-token probabilities (`Engine.score`, SGLang's /v1/score)
    RERANK = "rerank"  # documents by relevance (`Engine.rerank`, every rerank route)
    EMBED = "embed"  # one vector per text (`Engine.embed`)
    EMBED_TOKENS = "embed_tokens"  # every token's vector of a text (`Engine.embed_tokens`)
    EMBED_SPARSE = "embed_sparse"  # a sparse vocabulary vector per text (`Engine.embed_sparse`)
    EMBED_MULTI = "embed_multi"  # late-interaction multi-vectors per text (`Engine.embed_multi`)
    # any of dense, sparse and multi-vectors from one forward (`Engine.embed_hybrid`)
    EMBED_HYBRID = "embed_hybrid"
    RECIPE = "reranker"  # a rerank recipe named by `EngineConfig.reranker`
    TENSOR_PARALLEL = "tensor_parallel"  # weights sharded over devices
    ROOFLINE = "roofline"  # `engine.plan`'s model of its compute


VERBS = (
    Ability.SCORE,
    Ability.RERANK,
    Ability.EMBED,
    Ability.EMBED_TOKENS,
    Ability.EMBED_SPARSE,
    Ability.EMBED_MULTI,
    Ability.EMBED_HYBRID,
)


class Capabilities(msgspec.Struct, frozen=True):
    """For each `Ability`, None (the model has it) or the reason it is refused, in words for
    people."""

    refusals: dict[Ability, str | None]

    def refusal(self, ability: Ability) -> str | None:
        return self.refusals[ability]

    def offers(self, ability: Ability) -> bool:
        return self.refusals[ability] is None

    def verbs(self) -> list[str]:
        """The verbs the model serves, by name (what `Engine.info` and the REPL show)."""
        return [v.value for v in VERBS if self.offers(v)]

    def require(self, ability: Ability) -> None:
        """Nothing when the model has `ability`; else its refusal raised: InvalidInput naming
        `label_token_ids` for scores (the request's labels are what cannot be read), for the
        configuration's abilities naming the field, Unsupported for the other verbs."""
        why = self.refusals[ability]
        if why is None:
            return
        if ability is Ability.SCORE:
            raise InvalidInput("label_token_ids", why)
        if ability in VERBS:
            raise Unsupported(f"{ability.value} is unavailable for this model: {why}")
        raise InvalidInput(ability.value, why)


def capabilities_of(task, rerank_labels) -> Capabilities:
    """The record of a model of `task` whose rerank reads `rerank_labels` (the recipe's labels,
    or a string saying why its rerank cannot read them: `Task.rerank_labels`)."""
    refusals = {ability: task.refusal(ability) for ability in Ability}
    if refusals[Ability.RERANK] is None and isinstance(rerank_labels, str):
        refusals[Ability.RERANK] = rerank_labels
    return Capabilities(refusals)
