"""Configuration: every key declared once (keys), checked by one schema, resolved by one loader; the node config.

keys.py is the table; schema.py its checks; loader.py options < environment < file < defaults; nodeconfig.py the file.
"""
