"""The node config's tables that belong to one domain ([agent], [kubernetes]): their shapes and parsers.

They sit below the domains that use them so that gpuwarden.ops.config.nodeconfig can parse the whole file.
"""
