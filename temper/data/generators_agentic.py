"""Multi-step starter datasets: tasks generated together with their known end state.

``file_tasks``: a small work dir to be changed into a target state ("make the directory look like
this") by several shell commands or file writes. ``ledger_tasks``: a few accounts behind a small
stateful API (``temper.agent.ledger.Ledger``) to be brought to a target state by several
tool calls. Each record carries the start state, the exact expected end state and ``reference``:
the turns (JSON list of action texts, ending in ``<done/>``) of a scripted policy that solves it,
so the environment and the end-state check are proven on every record independently of any model.
The end state is computed by applying the same operations to a Python model of the state, and the
generator refuses a task whose end state equals its start (doing nothing must never pass).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pandas as pd

from temper.agent.environment import ACTION_HELP, Action, render_action
from temper.agent.ledger import Ledger

_WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "lambda"]
_NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]


def _frame(prefix: str, rows: int, seed: int, eval_fraction: float, make) -> pd.DataFrame:
    rng = random.Random(f"{prefix}:{seed}")
    records = []
    for i in range(rows):
        rec = {"id": f"{prefix}-{seed}-{i:06d}", **make(rng)}
        rec["split"] = "eval" if rng.random() < eval_fraction else "train"
        records.append(rec)
    return pd.DataFrame.from_records(records)


def _show_files(files: dict[str, str]) -> str:
    return "\n".join(f"--- {path} ---\n{files[path].rstrip(chr(10))}" for path in sorted(files)) or "(empty)"


def _file_ops(rng: random.Random, files: dict[str, str]) -> list[Action]:
    """2-4 operations applied to ``files`` in place; the actions that perform them."""
    actions: list[Action] = []
    for _ in range(rng.randint(2, 4)):
        names = sorted(files)
        kind = rng.choice(["create", "move", "delete", "append", "upper"] if names else ["create"])
        w, n = rng.choice(_WORDS), rng.randint(1, 9)
        if kind == "create":
            path = f"{rng.choice(['notes', 'out', 'docs'])}/{w}{n}.txt"
            if path in files:
                continue
            files[path] = f"{w} {n}\n"
            actions.append(Action("write", path=path, content=files[path]))
        elif kind == "move":
            src, dst = rng.choice(names), f"archive/{w}{n}.txt"
            if dst in files:
                continue
            files[dst] = files.pop(src)
            actions.append(Action("bash", command=f"mkdir -p archive && mv {src} {dst}"))
        elif kind == "delete":
            src = rng.choice(names)
            del files[src]
            actions.append(Action("bash", command=f"rm {src}"))
        elif kind == "append":
            src = rng.choice(names)
            files[src] = files[src].rstrip("\n") + f"\n{w} {n}\n"
            actions.append(Action("bash", command=f"echo '{w} {n}' >> {src}"))
        else:
            src = rng.choice(names)
            dst = src.rsplit(".", 1)[0] + ".upper"
            if dst in files:
                continue
            files[dst] = files[src].upper()
            actions.append(Action("bash", command=f"tr a-z A-Z < {src} > {dst}"))
    return actions


def file_tasks(rows: int, seed: int = 0, eval_fraction: float = 0.1) -> pd.DataFrame:
    def make(rng: random.Random) -> dict[str, Any]:
        while True:
            start = {f"{rng.choice(_WORDS)}.txt": f"{rng.choice(_WORDS)} {rng.randint(10, 99)}\n"
                     for _ in range(rng.randint(1, 3))}
            end = dict(start)
            actions = _file_ops(rng, end)
            if len(actions) >= 2 and end != start:
                break
        instruction = (f"The work directory holds these files:\n{_show_files(start)}\n\n"
                       f"Make it look exactly like this (no other files):\n{_show_files(end)}\n\n{ACTION_HELP}")
        turns = [render_action(a) for a in actions] + ["<done/>"]
        return {"instruction": instruction, "start_files": json.dumps(start, sort_keys=True),
                "end_files": json.dumps(end, sort_keys=True), "reference": json.dumps(turns)}

    return _frame("files", rows, seed, eval_fraction, make)


def _ledger_ops(rng: random.Random, ledger: Ledger) -> tuple[list[str], list[Action]]:
    """2-4 operations applied to ``ledger``; what the task asks for, and the calls that do it."""
    asks: list[str] = []
    actions: list[Action] = []
    for _ in range(rng.randint(2, 4)):
        names = sorted(ledger.accounts)
        kind = rng.choice(["transfer", "deposit", "withdraw", "open", "close"])
        if kind == "transfer" and len(names) >= 2:
            src, dst = rng.sample(names, 2)
            if ledger.accounts[src] == 0:
                continue
            amount = rng.randint(1, ledger.accounts[src])
            ledger.transfer(src, dst, amount)
            asks.append(f"move {amount} from {src} to {dst}")
            actions.append(Action("call", name="transfer", arguments={"source": src, "target": dst, "amount": amount}))
        elif kind == "deposit" and names:
            acc, amount = rng.choice(names), rng.randint(1, 50)
            ledger.deposit(acc, amount)
            asks.append(f"deposit {amount} into {acc}")
            actions.append(Action("call", name="deposit", arguments={"account": acc, "amount": amount}))
        elif kind == "withdraw" and names:
            acc = rng.choice(names)
            if ledger.accounts[acc] == 0:
                continue
            amount = rng.randint(1, ledger.accounts[acc])
            ledger.withdraw(acc, amount)
            asks.append(f"withdraw {amount} from {acc}")
            actions.append(Action("call", name="withdraw", arguments={"account": acc, "amount": amount}))
        elif kind == "open":
            new = next((n for n in _NAMES if n not in ledger.accounts), None)
            if new is None:
                continue
            amount = rng.randint(1, 40)
            ledger.open_account(new)
            ledger.deposit(new, amount)
            asks.append(f"open an account {new} holding {amount}")
            actions += [Action("call", name="open_account", arguments={"account": new}),
                        Action("call", name="deposit", arguments={"account": new, "amount": amount})]
        elif kind == "close" and len(names) >= 2:
            acc, heir = rng.sample(names, 2)
            balance = ledger.accounts[acc]
            if balance:
                ledger.transfer(acc, heir, balance)
                actions.append(Action("call", name="transfer", arguments={"source": acc, "target": heir,
                                                                          "amount": balance}))
            ledger.close_account(acc)
            asks.append(f"close {acc}, moving what it holds to {heir}")
            actions.append(Action("call", name="close_account", arguments={"account": acc}))
    return asks, actions


def ledger_tasks(rows: int, seed: int = 0, eval_fraction: float = 0.1) -> pd.DataFrame:
    def make(rng: random.Random) -> dict[str, Any]:
        while True:
            start = {n: rng.randint(0, 100) for n in rng.sample(_NAMES[:5], rng.randint(2, 3))}
            ledger = Ledger(start)
            asks, actions = _ledger_ops(rng, ledger)
            if len(actions) >= 2 and ledger.accounts != start:
                break
        show = ", ".join(f"{k}={v}" for k, v in sorted(ledger.accounts.items()))
        instruction = (f"Ledger accounts: {', '.join(f'{k}={v}' for k, v in sorted(start.items()))}.\n"
                       f"Tools: list_accounts(), get_balance(account), open_account(account), "
                       f"close_account(account), deposit(account, amount), withdraw(account, amount), "
                       f"transfer(source, target, amount).\nTask: {'; then '.join(asks)}.\n"
                       f"At the end the accounts must be exactly: {show}.\n{ACTION_HELP}")
        turns = [render_action(a) for a in actions] + ["<done/>"]
        return {"instruction": instruction, "start_accounts": json.dumps(start, sort_keys=True),
                "end_accounts": json.dumps(ledger.accounts, sort_keys=True), "reference": json.dumps(turns)}

    return _frame("ledger", rows, seed, eval_fraction, make)
