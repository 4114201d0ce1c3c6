"""The backbone axis of a task: a causal decoder or a bidirectional encoder. It decides how a
request's items become sequences (behind a shared prefix through a rerank recipe, or whole pairs
and texts), how they are laid out in a batch, and the forward and weight layout that run them."""

from collections.abc import Callable, Sequence

from engine import templates
from engine.capabilities import Ability
from engine.host import truncation
from engine.host.pairs import PairOptions
from engine.kinds import Layout
from engine.models import decoder, encoder
from engine.models.layout import place_decoder, place_encoder


class Backbone:
    """What a kind of backbone decides; `Decoder` and `Encoder` are the two."""

    name: str  # "decoder" | "encoder"
    forward: Callable  # (params, inputs, pool, *, cfg, family, ...) -> (outputs, pool)
    place: Callable  # (host params, cfg, dtype, dense) -> device params
    # a rerank reads its documents as pairs with the query (CrossEncoder's truncation); False:
    # through the model's rerank recipe (`engine.templates`)
    reads_pairs: bool = False

    def layout(self, every_token: bool) -> Layout:
        """How its sequences are laid out for an output that reads `every_token`'s state of
        its sequence (else the score row's alone)."""
        raise NotImplementedError

    def refusals(self) -> dict[Ability, str]:
        """What no model of this backbone can do, and why."""
        return {}

    def rerank_inputs(
        self,
        config,
        template,
        tokenizer,
        query: str,
        documents: Sequence[str],
        instruction,
        fit,
        side,
    ) -> tuple:
        """A rerank's score call: its query, items, and how they pair (`PairOptions`, None when
        the items follow the query as one sequence). `fit` bounds a pair's tokens (None: the
        model's own limit), cut at `side`."""
        raise NotImplementedError

    def document_room(self, template, tokenizer, query: str, instruction, fit: int) -> int | None:
        """Tokens a rerank's document may keep so that its prompt has at most `fit` tokens; None
        when the documents are not cut for it (pairs are truncated as they are encoded)."""
        return None


class Decoder(Backbone):
    name = "decoder"
    forward = staticmethod(decoder.forward)
    place = staticmethod(place_decoder)

    def layout(self, every_token: bool) -> Layout:
        # an output that reads every token's state cannot share a prefix: it is computed once,
        # but each of its sequences would need its states (and a cached one's are not computed)
        return Layout.ALONE if every_token else Layout.SHARED

    def rerank_inputs(self, config, template, tokenizer, query, documents, instruction, fit, side):
        prompt, items = templates.rerank_inputs(template, tokenizer, query, documents, instruction)
        return prompt, items, None

    def document_room(self, template, tokenizer, query, instruction, fit):
        return truncation.room_for_document(tokenizer, template, query, instruction, fit)


class Encoder(Backbone):
    name = "encoder"
    forward = staticmethod(encoder.forward)
    place = staticmethod(place_encoder)
    reads_pairs = True

    def layout(self, every_token: bool) -> Layout:
        return Layout.WHOLE

    def refusals(self) -> dict[Ability, str]:
        return {
            Ability.RECIPE: "this is a cross-encoder: it reads each pair as it is, with no recipe",
            Ability.TENSOR_PARALLEL: "encoder models run whole on each device: use data_parallel",
            Ability.ROOFLINE: "the plan models decoders; this is a cross-encoder",
        }

    def rerank_inputs(self, config, template, tokenizer, query, documents, instruction, fit, side):
        """The texts themselves as pairs, truncated to the model's max length (CrossEncoder's),
        or to `fit` when that is shorter."""
        limit = min(config.max_length, fit or config.max_length)
        return query, list(documents), PairOptions(limit=limit, side=side)


def backbone_for(config) -> Backbone:
    """The backbone of a checkpoint of `config`."""
    return Encoder() if config.encoder else Decoder()
