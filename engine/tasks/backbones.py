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
        self, config, template, tokenizer, query: str, documents: Sequence[str], options
    ) -> tuple:
        """A rerank's score call under `options` (`engine.rerank.RerankOptions`): its query,
        its items, how they pair (`PairOptions`, None when the items follow the query as one
        sequence), and the tokens its cut took off (pairs count theirs as they encode)."""
        raise NotImplementedError


class Decoder(Backbone):
    name = "decoder"
    forward = staticmethod(decoder.forward)
    place = staticmethod(place_decoder)

    def layout(self, every_token: bool) -> Layout:
        # an output that reads every token's state cannot share a prefix: it is computed once,
        # but each of its sequences would need its states (and a cached one's are not computed)
        return Layout.ALONE if every_token else Layout.SHARED

    def rerank_inputs(self, config, template, tokenizer, query, documents, options):
        """The recipe's texts; with a cut, its sequences' token ids, each document's own tokens
        cut on them (`engine.host.truncation.recipe_ids`)."""
        if options.max_tokens_per_doc is None and options.fit is None:
            args = (template, tokenizer, query, documents, options.instruction)
            return (*templates.rerank_inputs(*args), None, 0)
        prompt, items, cut = truncation.recipe_ids(
            template,
            tokenizer,
            query,
            documents,
            options.instruction,
            limit=options.max_tokens_per_doc,
            fit=options.fit,
            side=options.truncation_side,
        )
        return prompt, items, None, cut


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

    def rerank_inputs(self, config, template, tokenizer, query, documents, options):
        """The texts themselves as pairs, truncated to the model's max length (CrossEncoder's),
        or to `fit` when that is shorter, each document first to `max_tokens_per_doc` of its own
        tokens."""
        limit = min(config.max_length, options.fit or config.max_length)
        side, per_document = options.truncation_side, options.max_tokens_per_doc
        return (
            query,
            list(documents),
            PairOptions(limit=limit, side=side, item_limit=per_document),
            0,
        )


def backbone_for(config) -> Backbone:
    """The backbone of a checkpoint of `config`."""
    return Encoder() if config.encoder else Decoder()
