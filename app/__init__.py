"""The Gradio app (``gradio app/main.py``): the page (``app.ui``: tabs, controls, handlers, estimates, browser
scripts) over the hardened host (``app.host``: server and launch, gate, uploads, sessions, files, the trace worker,
the API routes, settings and what the server holds). ``app.main`` lays out the page and is the entry point.
The page may import the host; the host never imports the page. Both ask ``dex_core``'s face and ``visualize``."""
