"""Data contracts: YAML that people edit (one file per contract), compiled to Great Expectations suites.

`model.py` is the typed form of a contract file, `rules.py` the family-specific checks that need a
derived column, `compiler.py` turns a contract into a GX ExpectationSuite, `runner.py` runs it through
GX and turns GX's results into a report a person can act on.
"""
