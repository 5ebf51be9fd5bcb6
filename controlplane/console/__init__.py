"""The web SLO console, served by the control plane itself (same origin as the API).

:func:`mount_console` mounts it on the app: ``/`` redirects to ``/console/``; the pages
(server-rendered Jinja2 templates, each with one small ES module that reads the REST API)
live under ``/console``, their static files under ``/console/static`` (gzip-compressed, as
every answer of the app but event streams);
``/docs`` serves Swagger UI from the same built assets (no CDN). The front-end libraries
(uPlot, Swagger UI) come from npm: ``package.json`` and its lockfile here, copied into
``static/vendor`` by ``build.mjs`` (``make install``). See ``docs/console.md``.

Example::

    app = create_app(settings)   # calls mount_console(app)
"""

from controlplane.console.pages import mount_console

__all__ = ["mount_console"]
