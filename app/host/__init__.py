"""The app's host: what a public server shared by strangers needs whatever the page shows. Its settings
(``settings``), what the server holds (``state.Runtime``: the model, explorer groups, profiles; ``learned``: what
finished runs teach the next estimate), sessions and their memory (``sessions``), the app's folder and exports
(``files``), uploads counted from their first byte (``uploads``), the ASGI gate (``gate``), uploaded traces read in
a bounded worker (``trace_worker``), the OpenAI routes (``api_routes``) and the launch (``server``).

Imports ``dex_core``'s face and ``visualize`` only; never ``app.ui``. Kept import-light: ``python -m
app.host.trace_worker`` loads this package before the worker."""
