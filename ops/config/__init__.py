"""Configuration: every key declared once (keys), checked by one schema, resolved by one loader; the node config.

keys.py the table, schema.py its checks, loader.py defaults < file < environment < options, nodeconfig.py the file.
"""
