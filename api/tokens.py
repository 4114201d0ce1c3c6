"""Tokenizing and decoding with the served model's tokenizer: vLLM's `/tokenize` (a `prompt`)
and `/detokenize`, TEI's `/tokenize` (`inputs`) and `/decode`. Which `/tokenize` answers
follows from the body's fields, as with the score and rerank routes."""

from typing import Annotated

import anyio
import msgspec
import numpy as np
import tokenizers
from starlette.requests import Request
from starlette.responses import Response

from api.errors import ApiError, TeiError
from api.schemas import TokenId
from api.scoring import json_response
from api.service import Service

TokenIds = list[TokenId]


class TokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's completion form: one prompt. (Its chat form, `messages`, is not served.)"""

    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False
    model: str | None = None


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int  # the tokens one input may have (an embedder's max_seq_length)
    tokens: TokenIds
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    tokens: TokenIds
    model: str | None = None


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str


class TeiTokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    inputs: str | Annotated[list[str], msgspec.Meta(min_length=1)]
    add_special_tokens: bool = True
    prompt_name: str | None = None  # TEI's sentence-transformers prompts: none here


class SimpleToken(msgspec.Struct, kw_only=True):
    id: int
    text: str
    special: bool
    start: int | None  # UTF-8 byte offsets in the input, as TEI's; null for a special token
    stop: int | None


class TeiDecodeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    ids: list[TokenId | TokenIds]  # one id list, or several
    skip_special_tokens: bool = True


_vllm = msgspec.json.Decoder(TokenizeRequest)
_tei = msgspec.json.Decoder(TeiTokenizeRequest)
_detokenize = msgspec.json.Decoder(DetokenizeRequest)
_decode = msgspec.json.Decoder(TeiDecodeRequest)
_keys = msgspec.json.Decoder(dict[str, msgspec.Raw])


async def tokenize(service: Service, request: Request) -> Response:
    """vLLM's `/tokenize` for a `prompt`, TEI's for `inputs`."""
    body = await service.body(request)
    try:
        keys = set(_keys.decode(body))
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        keys = set()  # the decoder below names the problem
    if "messages" in keys:
        message = "messages: chat prompts are not served (no chat template): send a `prompt`"
        raise ApiError(400, message, param="messages")
    tei = "inputs" in keys
    if tei:
        try:
            req = service.parse(body, _tei)
            return await _tei_tokenize(service.engine(service.route(request)), req)
        except ApiError as e:
            raise TeiError(e) from None
    req = service.parse(body, _vllm)
    return await _vllm_tokenize(service.engine(service.route(request, req.model)), req)


async def _vllm_tokenize(engine, req: TokenizeRequest) -> Response:
    tok: tokenizers.Tokenizer = engine.tokenizer
    enc = await anyio.to_thread.run_sync(
        lambda: tok.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    )
    return json_response(
        TokenizeResponse(
            count=len(enc.ids),
            max_model_len=engine.max_input_tokens,
            tokens=enc.ids,
            token_strs=enc.tokens if req.return_token_strs else None,
        )
    )


async def _tei_tokenize(engine, req: TeiTokenizeRequest) -> Response:
    if req.prompt_name is not None:
        raise ApiError(400, "prompt_name: this model has no prompts", param="prompt_name")
    texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
    for i, text in enumerate(texts):
        if not text:
            raise ApiError(400, f"inputs[{i}]: cannot be empty", param=f"inputs[{i}]", empty=True)
    tok: tokenizers.Tokenizer = engine.tokenizer
    encodings = await anyio.to_thread.run_sync(
        lambda: tok.encode_batch(texts, add_special_tokens=req.add_special_tokens)
    )
    return json_response([_simple_tokens(t, e) for t, e in zip(texts, encodings, strict=True)])


def _simple_tokens(text: str, enc: tokenizers.Encoding) -> list[SimpleToken]:
    """TEI's tokens: a special token by its string and no offsets, the others by their span,
    its offsets in bytes (TEI's Rust tokenizer counts UTF-8 bytes; `tokenizers`' Python
    encodings count characters)."""
    at = None if text.isascii() else _byte_offsets(text)
    out = []
    for token_id, token, special, (start, stop) in zip(
        enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets, strict=True
    ):
        if special:
            out.append(SimpleToken(id=token_id, text=token, special=True, start=None, stop=None))
        else:
            span = text[start:stop]
            if at is not None:
                start, stop = int(at[start]), int(at[stop])
            out.append(SimpleToken(id=token_id, text=span, special=False, start=start, stop=stop))
    return out


def _byte_offsets(text: str) -> np.ndarray:
    """i64[len(text) + 1]: the UTF-8 byte offset of each character offset of `text`."""
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), "<u4")
    sizes = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
    return np.concatenate([[0], np.cumsum(sizes)])


async def detokenize(service: Service, request: Request) -> Response:
    """vLLM's `/detokenize`: the text of token ids."""
    req = service.parse(await service.body(request), _detokenize)
    engine = service.engine(service.route(request, req.model))
    _check_ids(req.tokens, engine.model_config.vocab_size, "tokens")
    text = engine.tokenizer.decode(req.tokens, skip_special_tokens=False)
    return json_response(DetokenizeResponse(prompt=text))


async def decode(service: Service, request: Request) -> Response:
    """TEI's `/decode`: the text of each id list."""
    try:
        req = service.parse(await service.body(request), _decode)
        engine = service.engine(service.route(request))
        lists = [isinstance(i, list) for i in req.ids]
        if any(lists) and not all(lists):
            raise ApiError(400, "ids: give one id list or a list of id lists", param="ids")
        batch = req.ids if any(lists) else [req.ids]
        if not batch or not all(batch):
            raise ApiError(400, "ids: cannot be empty", param="ids", empty=True)
        for i, ids in enumerate(batch):
            _check_ids(ids, engine.model_config.vocab_size, f"ids[{i}]")
        tok = engine.tokenizer
        texts = tok.decode_batch(batch, skip_special_tokens=req.skip_special_tokens)
    except ApiError as e:
        raise TeiError(e) from None
    return json_response(texts)


def _check_ids(ids: list[int], vocab_size: int, field: str) -> None:
    if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
        raise ApiError(
            400, f"{field}: token id outside the vocabulary [0, {vocab_size})", param=field
        )


# the documented bodies of the answers that are bare lists
TEI_TOKENS = list[list[SimpleToken]]
TEI_TEXTS = list[str]
