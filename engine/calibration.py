"""The int8 mode's calibration pass: the checkpoint run in float32 over the built-in texts
(`engine.calibration_texts`), each layer matrix's inputs recorded
(`score_kernels.calibration.recording`), for GPTQ to round the int8 weights against
(`EngineConfig.int8_rounding`)."""

import logging

from engine.calibration_texts import PASSAGES, QUESTIONS
from engine.config import EngineConfig
from engine.device.program import DeviceProgram
from engine.loaders import Checkpoint
from engine.messages import ScoreRequest
from score_kernels.calibration import Hessians, recording

log = logging.getLogger("engine")

ROUNDINGS = ("nearest", "gptq")  # `EngineConfig.int8_rounding`
ASK = "Is this passage relevant to the question? Answer yes or no:"


def sequences() -> list[str]:
    """The calibration pass's texts: each built-in question and passage alone, then each passage
    as a relevance prompt under a question, the form of the scoring requests a decoder serves
    (with those prompts, SmolLM2's W1 log-probs in int8 moved from f32's by a mean 0.066, by 0.110
    with the texts alone: docs/int8.md)."""
    prompts = [
        f"Question: {QUESTIONS[i % len(QUESTIONS)]}\nPassage: {p}\n{ASK}"
        for i, p in enumerate(PASSAGES)
    ]
    return [*QUESTIONS, *PASSAGES, *prompts]


def recording_program(
    config: EngineConfig, checkpoint: Checkpoint
) -> tuple[DeviceProgram, Hessians]:
    """`checkpoint` in float32 with XLA's products, each recording its inputs into the Hessians
    returned beside it, for an engine of `config` to run `request` through."""
    log.info("int8: calibrating GPTQ's rounding over the built-in texts in float32")
    hessians = Hessians()
    program = DeviceProgram(
        checkpoint,
        dtype="float32",
        dense=recording(hessians),
        attention=config.attention,
        kv_cache_bytes=0,
        block_size=config.block_size,
    )
    return program, hessians


def request(task, tokenizer) -> ScoreRequest:
    """The calibration texts as one request of the task's first output, each text a sequence
    alone."""
    ids = [tokenizer.encode(text).ids for text in sequences()]
    return ScoreRequest(query=[], items=ids, label_token_ids=[0], output=task.outputs[0])
