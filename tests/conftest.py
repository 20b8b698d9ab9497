import os
import sys

# tests/ holds shared helpers (procs.py) imported by several test files.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
