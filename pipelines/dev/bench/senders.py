"""Remote-write senders for ``medallion bench``, in a process of their own as real senders are.

``python -m pipelines.dev.bench.senders PORT BODIES SENDERS`` loads the pickled bodies (a list of
bodies, or a list of rounds of bodies), prints ``ready`` and then, for each line on stdin, posts
bodies from SENDERS threads, each over one keep-alive connection as Prometheus' and vmagent's
shards do (again after a 429, on a new connection if the server closed it), and prints the count
of each final status as JSON. ``go`` sends every body; ``go A B`` sends rounds A to B - 1, in order.
"""

from __future__ import annotations

import http.client
import json
import pickle
import queue
import sys
import threading
import time
from collections import Counter

HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


#: Seconds a sender keeps reconnecting to a server that closed or refused it before it gives up.
GIVE_UP_SECONDS = 30.0
#: The status counted for a body that could not be delivered.
UNDELIVERED = 0


def post(conn: http.client.HTTPConnection, body: bytes) -> int:
    """Post ``body`` on ``conn`` until it is answered other than 429; its final status, or
    :data:`UNDELIVERED` once the server has refused or dropped the connection for
    :data:`GIVE_UP_SECONDS`."""
    failing_since: float | None = None
    while True:
        try:
            conn.request("POST", "/api/v1/write", body=body, headers=HEADERS)
            response = conn.getresponse()
            response.read()
        except (OSError, http.client.HTTPException):  # closed by the server: reconnect and resend
            conn.close()
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > GIVE_UP_SECONDS:
                return UNDELIVERED
            time.sleep(0.01)
            continue
        if response.status != 429:
            return response.status
        time.sleep(0.05)


def send(port: int, bodies: list[bytes], senders: int) -> Counter[int]:
    """Post ``bodies`` from ``senders`` threads, each taking the next body when it is answered."""
    waiting: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    for body in bodies:
        waiting.put(body)
    statuses: Counter[int] = Counter()
    lock = threading.Lock()

    def sender() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            while True:
                try:
                    body = waiting.get_nowait()
                except queue.Empty:
                    return
                status = post(conn, body)
                with lock:
                    statuses[status] += 1
        finally:
            conn.close()

    threads = [threading.Thread(target=sender) for _ in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def main(argv: list[str]) -> None:
    port, path, senders = int(argv[0]), argv[1], int(argv[2])
    with open(path, "rb") as f:
        loaded = pickle.load(f)  # written by the bench itself, never by anyone else
    rounds: list[list[bytes]] = loaded if loaded and isinstance(loaded[0], list) else [loaded]
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        first, end = (int(words[1]), int(words[2])) if len(words) == 3 else (0, len(rounds))
        statuses = send(port, [body for r in rounds[first:end] for body in r], senders)
        print(json.dumps(statuses), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
