"""`gpuwarden doctor`: is this node fit to serve? Small named checks, run concurrently, each explained.

Every check reads through the settings' roots (/sys, /proc, /etc, /boot, /opt), so a captured tree or a bundle is checked
by the same code as the live node; see checks/ for what each one reads and how it decides.
"""
