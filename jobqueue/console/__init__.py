"""The operator console inside the Django admin: read models (readmodels.py), pages (pages.py),
one view per operator action with its permission beside it (posts.py), what an action does
(actions.py), the plumbing they share (site.py); who sees and acts on which queue, the one rule
every page and action asks (access.py, from the settings jobqueue/grants.py parses); a flow
drawn as a graph (flowgraph.py); an error read by its last line (errors.py); sealed values
shown sealed (sealed.py); a search (query.py: what its URL asks; search.py: run over the
history and live jobs; searching.py: its page and a bulk operation's), bulk operations on
everything a search matches (bulk.py), hidden arguments (hidden.py). Its URLs and admin are
`jobqueue/urls.py` and `jobqueue/admin.py`, where Django and the docs look.

May import every room (the worker only for `presence`). This `__init__` imports nothing.
"""
