"""Shared by the REPL's unit tests (no tests here): a tiny vocabulary and a session ready to
score."""

from engine.repl.session import Session

VOCAB = {"yes": [5], " yes": [6], "no": [7], " no": [8], "maybe": [9, 10]}


def fake_encode(text: str) -> list[int]:
    return VOCAB.get(text, [ord(c) for c in text])


def ready(session: Session, *items: str) -> Session:
    """A session with a query, labels yes/no and `items` pending."""
    for line in ["? the query", ":labels yes no", *items]:
        session.handle(line)
    return session
