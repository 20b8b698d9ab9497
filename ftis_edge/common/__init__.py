"""What every part of a node leans on: atomic writes, clean child interpreters, paths, safe
terminal text, free ports, end-of-turn texts, install hints, the hub check."""
