"""BERT cross-encoders (the ms-marco MiniLM rerankers): learned positions and token types,
LayerNorm after each residual add, a GELU MLP, and the pooler (dense, tanh) on the first token
before the classifier."""

from engine.models.decoder import Family
from engine.models.encoder import config_from_hf


def config(hf: dict, **flags):
    flags = (
        dict(
            family="bert",
            post_norm=True,
            position_table=True,
            type_vocab_size=int(hf.get("type_vocab_size", 2)),
            gated_mlp=False,
        )
        | flags
    )
    return config_from_hf(hf, **flags)


FAMILY = Family(name="bert", config_from_hf=config)
