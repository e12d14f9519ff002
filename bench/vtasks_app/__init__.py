"""django-vtasks' side of bench/peers.py (its own Django project: see vtasks_settings.py)."""
