"""The small stateful API of the ``ledger_tasks`` domain: accounts with integer balances.

Tool calls arrive as data (a name from ``LEDGER_TOOLS`` and JSON arguments), never as code, so the
API runs in process; the episode's end state is ``Ledger.accounts`` (``LedgerEnvironment``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from temper.agent.environment import Action, EpisodeEnvironment, Outcome


class Ledger:
    """Accounts with integer balances. Every method returns a JSON-able result or raises ValueError
    (the model sees the error and may try again). No code of the model runs: arguments are data."""

    def __init__(self, accounts: dict[str, int]) -> None:
        self.accounts = dict(accounts)

    def _account(self, name: Any) -> str:
        if not isinstance(name, str) or name not in self.accounts:
            raise ValueError(f"no account {name!r}")
        return name

    @staticmethod
    def _amount(amount: Any) -> int:
        if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
            raise ValueError(f"amount must be a positive integer, got {amount!r}")
        return amount

    def list_accounts(self) -> dict[str, int]:
        return dict(sorted(self.accounts.items()))

    def get_balance(self, account: str) -> int:
        return self.accounts[self._account(account)]

    def open_account(self, account: str) -> str:
        if not isinstance(account, str) or not re.fullmatch(r"[a-z]{1,16}", account):
            raise ValueError(f"account names are 1-16 lowercase letters, got {account!r}")
        if account in self.accounts:
            raise ValueError(f"account {account!r} exists")
        self.accounts[account] = 0
        return "ok"

    def close_account(self, account: str) -> str:
        if self.accounts[self._account(account)] != 0:
            raise ValueError(f"account {account!r} is not empty")
        del self.accounts[account]
        return "ok"

    def deposit(self, account: str, amount: int) -> int:
        self.accounts[self._account(account)] += self._amount(amount)
        return self.accounts[account]

    def withdraw(self, account: str, amount: int) -> int:
        name, amount = self._account(account), self._amount(amount)
        if self.accounts[name] < amount:
            raise ValueError(f"insufficient funds in {name!r}")
        self.accounts[name] -= amount
        return self.accounts[name]

    def transfer(self, source: str, target: str, amount: int) -> str:
        self._account(target)
        self.withdraw(source, amount)
        self.accounts[target] += amount
        return "ok"


LEDGER_TOOLS = ("list_accounts", "get_balance", "open_account", "close_account", "deposit", "withdraw", "transfer")


class LedgerEnvironment(EpisodeEnvironment):
    """A ``ledger_tasks`` record: ``start_accounts`` in a fresh ``Ledger``, tool calls against it,
    reward when the accounts equal ``end_accounts`` exactly."""

    name = "ledger"
    kinds = ("call", "done")

    def _start(self, record: dict[str, Any]) -> str:
        self.ledger = Ledger(json.loads(record["start_accounts"]))
        return record["instruction"]

    def _act(self, action: Action, timeout_s: float) -> tuple[str, Outcome | None]:
        if action.name not in LEDGER_TOOLS:
            return f"error: unknown tool {action.name!r}; tools: {', '.join(LEDGER_TOOLS)}", None
        try:
            result = getattr(self.ledger, action.name)(**action.arguments)
        except (TypeError, ValueError, KeyError) as e:
            return f"error: {e}", None
        return json.dumps(result, sort_keys=True), None

    def _end_state_ok(self) -> bool:
        return self.ledger.accounts == json.loads(self.record["end_accounts"])
