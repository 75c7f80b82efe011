"""The web console at ``/console`` (docs/operations.md “Console”): server-rendered pages over the
management API's operations (core/api/manage.py), for a person with an API token.

- core/api/console/routes.py: the pages, the login and the actions;
- core/api/console/sessions.py: sessions and their CSRF tokens;
- templates/: the pages (Jinja2); static/: the stylesheet and the one script, which refreshes
  the live parts of a page and draws the charts (no build step, nothing from a CDN).
"""
