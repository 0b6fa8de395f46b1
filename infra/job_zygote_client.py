"""``python job_zygote_client.py SOCKET -m MODULE ARGS``: run ``python -m MODULE ARGS`` as a fork of the job zygote
(``job_zygote.py``), or in a fresh interpreter when the zygote does not serve it.

Standard library only, and no import of the package: this process is started for every job and every rank, and
its whole point is to cost milliseconds. It stays the job's process for whoever started it: signals it receives
are relayed to the job, its exit status is the job's, and when it dies the job is killed.
"""

import json
import os
import signal
import socket
import struct
import sys

RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STARTED = b"S"  # the monitor's first byte once the job runs; its exit status follows (job_zygote.STARTED)


def main() -> None:
    path, argv = sys.argv[1], sys.argv[2:]
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        data = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        socket.send_fds(sock, [struct.pack("!I", len(data)) + data], [0, 1, 2])
    except OSError:
        cold(argv)
    for signum in RELAYED:
        signal.signal(signum, lambda s, _frame: sock.sendall(bytes([s])))
    reply = b""
    while chunk := sock.recv(1 << 12):
        reply += chunk
    if not reply.startswith(STARTED):  # not served, or the zygote went away before the job started
        cold(argv)
    if reply == STARTED:  # started, and its monitor is gone without a status: never run a job twice
        print("job zygote: the job's monitor died before the job ended", file=sys.stderr, flush=True)
        sys.exit(1)
    status = json.loads(reply[len(STARTED):])["status"]
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    sys.exit(os.waitstatus_to_exitcode(status))


def cold(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main()
