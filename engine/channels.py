"""Helpers for the actors' trio memory channels."""

import trio


def drain(receive: trio.MemoryReceiveChannel, first, limit: int) -> list:
    """`first` plus whatever is already waiting in `receive`, up to `limit` messages."""
    batch = [first]
    while len(batch) < limit:
        try:
            batch.append(receive.receive_nowait())
        except trio.WouldBlock:
            break
    return batch
