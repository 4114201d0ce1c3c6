"""The int8 mode's calibration pass: the checkpoint run in float32 over the built-in texts
(`engine.calibration_texts`), each layer matrix's inputs recorded
(`score_kernels.calibration.recording`), for GPTQ to round the int8 weights against
(`EngineConfig.int8_rounding`) and SmoothQuant to smooth them by (`EngineConfig.int8_smoothing`)."""

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


def calibrates(config: EngineConfig) -> bool:
    """Whether `config`'s int8 rounding needs the calibration pass (GPTQ, or smoothing)."""
    return config.int8_rounding == "gptq" or config.int8_smoothing > 0


def method(config: EngineConfig) -> tuple[str, float]:
    """What the calibrated rounding of `config` is, for the rounding cache to tell apart."""
    return config.int8_rounding, float(config.int8_smoothing)


def recording_program(
    config: EngineConfig, checkpoint: Checkpoint
) -> tuple[DeviceProgram, Hessians]:
    """`checkpoint` in float32 with XLA's products, each recording its inputs into the Hessians
    returned beside it, for an engine of `config` to run `request` through."""
    log.info("int8: calibrating the rounding over the built-in texts in float32")
    hessians = Hessians(gptq=config.int8_rounding == "gptq", alpha=config.int8_smoothing)
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
