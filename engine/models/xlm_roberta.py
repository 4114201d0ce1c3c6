"""XLM-RoBERTa cross-encoders (bge-reranker-base/large, bge-reranker-v2-m3): BERT's layout with
positions counted from `pad_token_id + 1` and one token type; its classification head (dense,
tanh, out_proj on the first token) is BERT's pooler and classifier."""

import msgspec

from engine.models import bert
from engine.models.decoder import Family


def config(hf: dict):
    offset = int(hf.get("pad_token_id", 1)) + 1
    cfg = bert.config(
        hf,
        family="xlm-roberta",
        position_offset=offset,
        type_vocab_size=int(hf.get("type_vocab_size", 1)),
    )
    # the positions a sequence may use: the table less the ids below the offset
    return msgspec.structs.replace(
        cfg, max_position_embeddings=cfg.max_position_embeddings - offset
    )


FAMILY = Family(name="xlm-roberta", config_from_hf=config)
