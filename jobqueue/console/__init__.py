"""The operator console inside the Django admin: read models (readmodels.py), pages (pages.py),
what an action does (actions.py), the POST handlers and the plumbing every page shares
(site.py). Its URLs and admin are `jobqueue/urls.py` and `jobqueue/admin.py`, where Django and
the docs look.

May import every room (the worker only for `presence`). This `__init__` imports nothing.
"""
