"""Long episodes stay bounded: 500 turns through one sandbox session of the warm pool.

The scripted policy mixes what an agent does over a long task (append to a log, export a variable,
write files, list and count, print near the output cap every fifth turn). Over the episode: the
verifier process (this one) keeps its file descriptors, child processes and memory (a recorded
session step holds up to 1 MB of output: an episode must not keep them); turn latency late in the
episode is within 1.5x of early; the box's limits still hold at the end (a file over ``fsize_mb``
is cut, a fork bomb meets ``nproc``), and the session is intact after them (the shell state and
every file the policy wrote are there).
"""

from __future__ import annotations

import json
import os
import statistics
import time

import psutil
import pytest

from infra.sandbox import SandboxPool
from infra.sandbox.bwrap import bwrap_available
from temper.agent.environment import EpisodeLimits
from temper.agent.files import FilesEnvironment

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap (apt-get install bubblewrap)")]

TURNS = 500
BIG = 900_000  # bytes printed every fifth turn: under the 1 MB output cap, so the turn succeeds


def policy(i: int) -> str:
    if i % 5 == 4:
        return f"<bash>head -c {BIG} /dev/zero | tr '\\0' x</bash>"
    return [f"<bash>echo turn {i} >> log.txt && export LAST={i}</bash>",
            f'<write path="notes/n{i % 25}.txt">note {i}\n</write>',
            "<bash>ls notes | wc -l && wc -l < log.txt && echo $LAST</bash>"][i % 3]


FORKS = """import os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
except OSError as e:
    print("stopped at", n, e.strerror)
"""


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_500_turn_episode_keeps_the_verifier_and_the_box_bounded():
    record = {"instruction": "keep notes", "start_files": json.dumps({"README": "start\n"}),
              "end_files": json.dumps({})}
    limits = EpisodeLimits(max_turns=TURNS + 10, budget_s=3600, step_timeout_s=10, max_observation_chars=300)
    me = psutil.Process()
    with SandboxPool("shell", size=1) as pool:
        env = FilesEnvironment(limits, pool=pool)
        env.reset(**record)
        env.step(policy(0))  # warm: the first run of each kind
        fds, children, rss = _fds(), len(me.children(recursive=True)), me.memory_info().rss
        took = []
        for i in range(1, TURNS):
            start = time.perf_counter()
            observation = env.step(policy(i))
            took.append(time.perf_counter() - start)
            assert not env.finished, (i, env.outcome, observation)
        grown_mb = (me.memory_info().rss - rss) / 2**20
        assert _fds() == fds and len(me.children(recursive=True)) == children
        assert grown_mb < 40, f"the verifier grew by {grown_mb:.0f} MB over {TURNS} turns"
        early = statistics.median(t for i, t in enumerate(took[:60], 1) if i % 5 != 4)
        late = statistics.median(t for i, t in enumerate(took[-60:], TURNS - 60) if i % 5 != 4)
        assert late <= 1.5 * early + 0.01, f"turn latency {early * 1e3:.0f} ms early, {late * 1e3:.0f} ms late"

        # the box's limits hold at the end of the episode, and the episode goes on after them
        observation = env.step("<bash>head -c 100M /dev/zero > big.bin; echo rc=$?; stat -c %s big.bin</bash>")
        assert "rc=" in observation and "104857600" not in observation, observation
        env.step(f'<write path="forks.py">{FORKS}</write>')
        observation = env.step("<bash>python3 forks.py</bash>")
        assert not env.finished and observation.startswith("stopped at "), observation
        assert int(observation.split()[2]) < pool.profile.limits.nproc, observation
        observation = env.step("<bash>echo $LAST; ls notes | wc -l; wc -l < log.txt</bash>")
        appends = [i for i in range(TURNS) if i % 3 == 0 and i % 5 != 4]
        notes = {i % 25 for i in range(TURNS) if i % 3 == 1 and i % 5 != 4}
        assert observation.split()[:3] == [str(appends[-1]), str(len(notes)), str(len(appends))], observation
        env.close()
