"""``pods/exec`` over the websocket channel protocol (``v5.channel.k8s.io``, ``v4.channel.k8s.io``).

What a cluster does: the API server upgrades the request and the kubelet runs the command in the
container; every binary frame is one channel byte + data: 0 stdin (client -> server), 1 stdout,
2 stderr, 3 error (a ``metav1.Status`` JSON sent once, at the end: ``Success``, or ``Failure``
with reason ``NonZeroExitCode`` and the exit code in ``details.causes[ExitCode]``). v5 adds
channel 255 "close": ``[255, 0]`` from the client closes the command's stdin (EOF). Under v4
stdin is never closed by the client (the caller then has to frame its input, as temper does).

Here the kubelet starts the command as a new process with the container's environment, working
directory and mounts (``kubelet.exec_argv``); see the kubelet's docstring for how close that is
to entering the container's namespaces. A missing executable is reported the way runc does
(``executable file not found in $PATH``), on the error channel. If the client goes away, the
process is killed, as the kubelet kills an exec whose stream is gone.

Cut: ``tty``/resize (channel 4) are not served; no SPDY (the client only speaks websockets).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal

from aiohttp import WSMsgType, web

from tests.k8s_standin.store import ApiError

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255


def exit_status(code: int, command: list[str]) -> dict:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: error executing command {command}, "
                       f"exit code {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


def not_found_status(executable: str) -> dict:
    return {"metadata": {}, "status": "Failure", "reason": "InternalError",
            "message": f"Internal error occurred: error executing command in container: failed to exec in "
                       f'container: OCI runtime exec failed: exec failed: unable to start container process: '
                       f'exec: "{executable}": executable file not found in $PATH: unknown',
            "details": {"causes": [{"message": f'exec: "{executable}": executable file not found in $PATH'}]}}


async def serve_exec(request: web.Request, kubelet, pod: dict) -> web.StreamResponse:
    name = pod["metadata"]["name"]
    query = request.query
    command = query.getall("command", [])
    containers = [c["name"] for c in pod["spec"]["containers"]]
    container = query.get("container") or containers[0]
    if container not in containers:
        raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
    if not command:
        raise ApiError(400, "BadRequest", "you must specify at least 1 command")
    if not kubelet.container_running(pod["metadata"]["namespace"], name, container):
        raise ApiError(400, "BadRequest", f"unable to upgrade connection: container not found (\"{container}\")")
    if query.get("tty") in ("true", "1"):
        raise ApiError(400, "BadRequest", "tty is not served by the stand-in")
    ws = web.WebSocketResponse(protocols=PROTOCOLS, max_msg_size=64 << 20)
    await ws.prepare(request)
    v5 = ws.ws_protocol == PROTOCOLS[0]
    argv, env, cwd = kubelet.exec_argv(pod, container, command)
    if shutil.which(command[0], path=env.get("PATH")) is None and "/" not in command[0]:
        await ws.send_bytes(bytes([ERROR]) + json.dumps(not_found_status(command[0])).encode())
        await ws.close()
        return ws
    want_stdin = query.get("stdin") in ("true", "1")
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, cwd=cwd, start_new_session=True,
        stdin=asyncio.subprocess.PIPE if want_stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def pump(stream, channel: int) -> None:
        while chunk := await stream.read(65536):
            if query.get(("stdout" if channel == STDOUT else "stderr")) in ("true", "1"):
                await ws.send_bytes(bytes([channel]) + chunk)

    async def feed() -> None:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY or not msg.data:
                continue
            channel, data = msg.data[0], msg.data[1:]
            if channel == STDIN and proc.stdin is not None and data:
                try:
                    proc.stdin.write(data)
                    await proc.stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    pass
            elif v5 and channel == CLOSE and data[:1] == bytes([STDIN]) and proc.stdin is not None:
                proc.stdin.close()
        # the client went away: the kubelet ends the exec
        if proc.returncode is None:
            _kill(proc.pid)

    feeder = asyncio.create_task(feed())
    try:
        await asyncio.gather(pump(proc.stdout, STDOUT), pump(proc.stderr, STDERR))
        code = await proc.wait()
        if not ws.closed:
            await ws.send_bytes(bytes([ERROR]) + json.dumps(exit_status(code if code >= 0 else 128 - code,
                                                                        command)).encode())
            await ws.close()
    finally:
        feeder.cancel()
        if proc.returncode is None:
            _kill(proc.pid)
            await proc.wait()
    return ws


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
