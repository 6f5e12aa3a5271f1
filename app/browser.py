"""Scripts the page runs in the visitor's browser, installed by ``app.main`` (the Debugger's timeline
watcher is ``app.debugger.TIMELINE_JS``). They change how figures are drawn, never what a handler
returns, and ask the server for nothing."""

# A figure drawn while its tab is hidden gets Plotly's fallback width (700 px) and keeps it until the window
# is resized. Each figure's box is watched instead: when it changes (its tab opens), the figure is fitted to it.
FIT_PLOTS_JS = """() => {
  if (window.__dexFit) return;
  const fit = new ResizeObserver(entries => entries.forEach(e => {
    const gd = e.target.querySelector('.js-plotly-plot'), width = e.contentRect.width;
    if (gd && gd._fullLayout && window.Plotly && width > 0 && Math.abs(gd._fullLayout.width - width) > 2)
      window.Plotly.Plots.resize(gd);
  }));
  window.__dexFit = setInterval(() => document.querySelectorAll('.js-plotly-plot').forEach(gd => {
    if (gd.parentElement && !gd.parentElement.__dexFit) { gd.parentElement.__dexFit = true; fit.observe(gd.parentElement); }
  }), 500);
}"""

# The depth view carries both of its colourings (``visualize.charts.depth_colouring``): the Analysis tab's
# switch restyles the figure it shows, with no request and no model call.
DEPTH_COLOURS_JS = """(metric) => {
  const gd = document.querySelector('#an-depth .js-plotly-plot');
  const colouring = gd?.layout?.meta?.colourings?.[metric === 'rank' ? 'rank' : 'prob'];
  if (colouring && window.Plotly) window.Plotly.restyle(gd, colouring, [0]);
}"""
