"""Channel helpers."""

import math

import trio

from engine.channels import drain


def test_drain_takes_what_is_waiting_up_to_the_limit():
    async def main():
        send, receive = trio.open_memory_channel(math.inf)
        for i in range(5):
            send.send_nowait(i)
        first = await receive.receive()
        assert drain(receive, first, 3) == [0, 1, 2]
        assert drain(receive, "x", 10) == ["x", 3, 4]

    trio.run(main)
