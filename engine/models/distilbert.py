"""DistilBERT (SPLADE models such as OpenSearch's neural sparse encoders): BERT's layout with
its own names for the sizes, no token types, and LayerNorms of epsilon 1e-12. Sinusoidal
positions are read from the position table, where the checkpoint keeps them too."""

from engine.models import bert
from engine.models.decoder import Family

_NAMES = {  # DistilBERT's config names -> BERT's
    "dim": "hidden_size",
    "hidden_dim": "intermediate_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "activation": "hidden_act",
}


def config(hf: dict):
    renamed = {_NAMES.get(k, k): v for k, v in hf.items()}
    return bert.config({**renamed, "layer_norm_eps": 1e-12}, family="distilbert", type_vocab_size=0)


FAMILY = Family(name="distilbert", config_from_hf=config)
