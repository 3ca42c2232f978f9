"""The outbox answers go through: bytes queued by several threads at once all reach the socket
in one piece each, whoever of them is sending at the time."""
from __future__ import annotations

import select
import socket
import sys
import threading

from runtime.connection import Outbox


def _answers_sent_at_once(threads: int, each: int) -> bytes:
    """What a client receives when `threads` threads each queue `each` 10-byte answers at once."""
    sender, receiver = socket.socketpair()
    sender.setblocking(False)
    outbox, refused, received = Outbox(), [], bytearray()

    def answer(n: int) -> None:
        for _ in range(each):
            if not outbox.send_nowait(sender, bytes([65 + n]) * 10):
                refused.append(n)  # sent later by the flush below, as the leader does

    def read() -> None:
        while chunk := receiver.recv(65536):
            received.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    answering = [threading.Thread(target=answer, args=(n,)) for n in range(threads)]
    for thread in answering:
        thread.start()
    for thread in answering:
        thread.join()
    while refused and not outbox.flush_nowait(sender):
        select.select([], [sender], [], 1)
    sender.close()
    reader.join(timeout=10)
    receiver.close()
    return bytes(received)


def test_answers_queued_by_many_threads_at_once_all_go_out_whole() -> None:
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave inside the outbox as often as they can
    try:
        for _ in range(5):
            received = _answers_sent_at_once(8, 300)
            assert len(received) == 8 * 300 * 10
            answers = [received[i:i + 10] for i in range(0, len(received), 10)]
            assert all(len(set(a)) == 1 for a in answers)  # no answer cut into by another
    finally:
        sys.setswitchinterval(switching)
