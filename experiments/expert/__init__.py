"""The expert for H8 (issue 49 item 2): recipe in recipe.py, config in expert.toml."""
