"""A Mooncake segment holder for tests: sets up a bare Mooncake client that lends
``argv[3]`` bytes to the cluster of master ``argv[1]`` (metadata server ``argv[2]``), prints
``ready`` and holds the segment until SIGTERM/SIGKILL. No radixlink: it starts in a second."""

from __future__ import annotations

import signal
import sys
import threading

from mooncake.store import MooncakeDistributedStore


def main() -> int:
    master, metadata, segment_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = MooncakeDistributedStore()
    code = client.setup("127.0.0.1", metadata, segment_bytes, 1 << 20, "tcp", "", master)
    if code != 0:
        print(f"setup failed with code {code}", flush=True)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
