"""Contract -> Great Expectations 1.x ExpectationSuite.

Every expectation carries ``meta`` naming the contract check it came from, so the report
can say "rule parses_as_python on column test" rather than "__rule__... not in set".
"""

from __future__ import annotations

import great_expectations as gx
import great_expectations.expectations as gxe
import pandas as pd

from data_contracts.model import Contract
from data_contracts.rules import RULES, derived_column

_SPLIT_COLUMN = "__split_is_eval__"


def compile_suite(contract: Contract, name: str | None = None) -> gx.ExpectationSuite:
    suite = gx.ExpectationSuite(name=name or f"contract-{contract.name}")

    def add(exp, check: str, column: str | None = None) -> None:
        exp.meta = {"check": check, "column": column}
        suite.add_expectation(exp)

    add(gxe.ExpectTableRowCountToBeBetween(min_value=contract.min_rows, max_value=contract.max_rows), "row_count")
    for name, col in contract.columns.items():
        add(gxe.ExpectColumnToExist(column=name), "required", name)
        if col.not_null:
            add(gxe.ExpectColumnValuesToNotBeNull(column=name), "not_null", name)
        if col.type:
            add(gxe.ExpectColumnValuesToBeOfType(column=name, type_=col.type), "type", name)
        if col.unique:
            add(gxe.ExpectColumnValuesToBeUnique(column=name), "unique", name)
        if col.min_length is not None or col.max_length is not None:
            add(gxe.ExpectColumnValueLengthsToBeBetween(column=name, min_value=col.min_length,
                                                        max_value=col.max_length), "length", name)
        if col.allowed is not None:
            add(gxe.ExpectColumnValuesToBeInSet(column=name, value_set=col.allowed), "allowed_values", name)
        if col.regex:
            add(gxe.ExpectColumnValuesToMatchRegex(column=name, regex=col.regex), "regex", name)
    if contract.split:
        add(gxe.ExpectColumnMeanToBeBetween(column=_SPLIT_COLUMN, min_value=contract.split.eval_fraction_min,
                                            max_value=contract.split.eval_fraction_max),
            "split_ratio", contract.split.column)
    for r in contract.rules:
        add(gxe.ExpectColumnValuesToBeInSet(column=derived_column(r.rule, r.column), value_set=[True]),
            f"rule:{r.rule}", r.column)
    return suite


def prepare_frame(contract: Contract, frame: pd.DataFrame) -> pd.DataFrame:
    """Add the derived columns that split and family rules are checked on.

    A rule over a missing column yields all-False, so the missing column is reported both
    by ``required`` and by the rule; nothing is silently skipped.
    """
    out = frame.copy()
    if contract.split:
        col = contract.split.column
        out[_SPLIT_COLUMN] = (out[col] == contract.split.eval_value).astype(float) if col in out else 0.0
    for r in contract.rules:
        fn = RULES[r.rule]
        target = derived_column(r.rule, r.column)
        if r.column not in out or (r.with_column and r.with_column not in out):
            out[target] = False
            continue
        other = out[r.with_column] if r.with_column else [None] * len(out)
        out[target] = [bool(fn(v, o)) for v, o in zip(out[r.column], other)]
    return out
