"""Thin Prefect tasks over the plain functions in temper/ and infra/."""
