"""Judges for open-ended domains: rubric scoring, its cache, and calibration against humans."""
