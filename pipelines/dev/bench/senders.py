"""Remote-write senders for ``medallion bench``, in a process of their own as real senders are.

``python -m pipelines.dev.bench.senders PORT BODIES SENDERS`` loads the pickled list of bodies, prints
``ready``, waits for a line on stdin, posts every body from SENDERS threads (again after a 429)
and prints the count of each final status as JSON.
"""

from __future__ import annotations

import http.client
import json
import pickle
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def post(port: int, body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        while True:
            conn.request("POST", "/api/v1/write", body=body, headers=HEADERS)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 429:
                return resp.status
            time.sleep(0.05)
    finally:
        conn.close()


def main(argv: list[str]) -> None:
    port, path, senders = int(argv[0]), argv[1], int(argv[2])
    with open(path, "rb") as f:
        bodies: list[bytes] = pickle.load(f)  # written by the bench itself, never by anyone else
    print("ready", flush=True)
    sys.stdin.readline()
    with ThreadPoolExecutor(senders) as pool:
        statuses = Counter(pool.map(lambda body: post(port, body), bodies))
    print(json.dumps(statuses), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
