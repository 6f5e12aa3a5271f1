"""The app's page: what each tab's inputs send (``inputs``) and the controls they share (``controls``), the
handlers of Live (``live``), the Race (``race``), the Debugger (``debugger``, ``debugger_compare``) and Analysis
(``analysis``), what they share (``handlers``), the time estimates (``estimate``), what a page shows when it opens
(``page``) and the scripts run in the browser (``browser``). Imports ``app.host``, ``dex_core``'s face and
``visualize``."""
