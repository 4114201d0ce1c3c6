"""An interactive scorer over the embeddable engine.

    python -m engine.repl [--model PATH] [--dtype bfloat16|float32] [--token-budget N]
                          [--no-precompile | --precompile-in-background]

Set a query with `? text`, type one item per line, and an empty line scores them: a table of each
item's label probabilities (or, with `:rerank`, the documents in relevance order; for an embedder,
the items by the cosine similarity of their embeddings to the query's). `:help` lists
the commands. Piped input works for scripts: no prompts, results on stdout, errors on stderr as
`error: <message>`; whatever items are pending at end of input are scored.
"""

import argparse
import contextlib
import sys
import time

import trio

from engine.capabilities import Ability
from engine.config import EngineConfig
from engine.device.program import DTYPES
from engine.engine import Engine, open_engine
from engine.repl.loop import serve
from engine.repl.session import Session
from engine.repl.terminal import enable_history, interactive, read_pipe, read_tty, say, warn

DEFAULT_LABELS = (" yes", " no")


def make_session(engine: Engine) -> Session:
    """A session for this engine's tokenizer, labelled " yes" / " no" where those are tokens,
    in rerank mode for a model with a classification head, in embed mode for an embedder."""
    tokenizer = engine.tokenizer
    session = Session(
        lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
        engine.model_config.vocab_size,
    )
    with contextlib.suppress(ValueError):  # not single tokens here: the user picks labels
        session.set_labels(DEFAULT_LABELS)
    # a model without label-token scores (a classification head) reranks: that is what it does
    session.rerank = not engine.capabilities.offers(Ability.SCORE)
    caps = engine.capabilities
    session.embed = caps.offers(Ability.EMBED) or caps.offers(Ability.EMBED_SPARSE)
    return session


def _describe(engine: Engine, started: float) -> str:
    cfg = engine.config
    s = engine.stats()
    if not cfg.precompile:
        compiled = "compiling on demand"
    elif cfg.precompile_in_background:
        compiled = "compiling the bucket grid in the background"
    else:
        compiled = f"{s.compiles} programs compiled"
    return (
        f"ready: {cfg.model or 'default model'} ({engine.task.describe()}, {cfg.dtype}, "
        f"{compiled}, {time.perf_counter() - started:.1f}s); :help lists the commands"
    )


async def run(config: EngineConfig) -> None:
    """Open the engine, then serve lines from stdin until the user quits."""
    started = time.perf_counter()
    warn(f"loading {config.model or 'the default model'} ...")
    async with open_engine(config) as engine:
        warn(_describe(engine, started))
        tty = interactive()
        save_history = enable_history() if tty else lambda: None
        try:
            await serve(engine, make_session(engine), read_tty if tty else read_pipe, say, warn)
        finally:
            save_history()


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m engine.repl`."""
    p = argparse.ArgumentParser(prog="python -m engine.repl", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model", metavar="PATH", help="a .gguf file or HF directory (default: SmolLM2)"
    )
    p.add_argument(
        "--dtype", default="bfloat16", choices=sorted(DTYPES), help="weight dtype (%(default)s)"
    )
    p.add_argument(
        "--token-budget",
        metavar="N",
        type=_positive,
        default=EngineConfig().token_budget,
        help="most tokens in one packed batch (%(default)s)",
    )
    compiling = p.add_mutually_exclusive_group()
    compiling.add_argument(
        "--no-precompile", action="store_true", help="compile each shape on first use instead"
    )
    compiling.add_argument(
        "--precompile-in-background",
        action="store_true",
        help="ready at once, the bucket grid compiling behind (a new shape compiles first)",
    )
    return p


def _interrupted(e: BaseException) -> bool:
    if isinstance(e, BaseExceptionGroup):
        return e.split(KeyboardInterrupt)[1] is None
    return isinstance(e, KeyboardInterrupt)


def main(argv: list[str] | None = None) -> int:
    """Run the REPL; the process exit status."""
    args = parser().parse_args(argv)
    config = EngineConfig(
        model=args.model,
        dtype=args.dtype,
        token_budget=args.token_budget,
        precompile=not args.no_precompile,
        precompile_in_background=args.precompile_in_background,
    )
    for stream in (sys.stdin, sys.stdout):  # a stray non-UTF-8 byte must not end the session
        stream.reconfigure(errors="replace")
    try:
        trio.run(run, config)
    except (ValueError, OSError) as e:  # the model could not be loaded
        warn(f"error: {e}")
        return 1
    except BaseException as e:
        if _interrupted(e):
            warn("")  # the shell's prompt starts on a fresh line
            return 130
        raise
    return 0
