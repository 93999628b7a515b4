#!/bin/bash
# Verifier: run the task's pytest file with the image's own pytest; JUnit XML gives per-assertion results.
mkdir -p /logs/verifier
cd /app 2>/dev/null || cd /
PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -p no:cacheprovider -rA --junitxml=/logs/verifier/junit.xml /tests/test_outputs.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
