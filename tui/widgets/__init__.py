"""The main screen's panels: header, GPUs, engines, arena and events.

Each panel is handed a NodeSnapshot and draws it; none of them fetches anything.
"""
