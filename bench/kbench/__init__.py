"""The node-cost benchmark's modules (bench/compare.py is the driver)."""
